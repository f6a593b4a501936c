"""The workspace lifecycle the engine drives: `start`, `stop` (persist only), `shutdown`.

One `WorkspaceLifecycle` per session sandbox. Each verb does one thing (style §4):

- `start()` picks exactly one branch and reports which:
  *reused*   the live workspace's fingerprint equals the snapshot's, for the same fingerprint
             version and environment manifest digest: nothing is written. When a stat walk
             finds exactly the tree the cached fingerprint was computed from (`stat_listing`),
             that fingerprint is the live one and nothing else is computed;
  *restored* otherwise, when the store has a snapshot: the workspace is rebuilt from it
             (excluded paths stay), or `RestoreIncompleteError` leaves it as it was;
  *fresh*    when the store has nothing restorable: the directory is created and the
             optional `materialise` hook fills it.
- `stop()` persists a new snapshot and caches its fingerprint; on failure it drops the cached
  fingerprint and raises `PersistFailedError`, and the previous snapshot stays the latest
  (design invariant 7). It does not release anything.
- `shutdown()` releases what the lifecycle holds in memory; files stay where they are, so the
  next `start()` on this machine can reuse them without a restore.

Transitions are guarded by one enum, never by flags: `start` from NEW or STOPPED, `stop`
from STARTED, `shutdown` from anywhere; misuse raises `LifecycleStateError`. Verbs of one
lifecycle are serialized by a lock; exclusive use of a workspace across processes is the
engine's job (its job lease).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from cairn._concurrency import run_sync
from cairn.errors import CairnError
from cairn.snapshots import workspace_state
from cairn.snapshots.base import SnapshotStore
from cairn.snapshots.errors import LifecycleStateError, PersistFailedError
from cairn.snapshots.exclusions import Exclusions
from cairn.snapshots.fingerprint import FINGERPRINT_VERSION, LiveFingerprint, fingerprint_workspace
from cairn.snapshots.ids import SnapshotId, SnapshotScope
from cairn.snapshots.models import SnapshotInfo
from cairn.snapshots.persist import PersistRequest, Progress
from cairn.snapshots.stat_cache import StatCache
from cairn.snapshots.stat_listing import list_workspace

__all__ = [
    "LifecycleState",
    "Materialise",
    "StartOutcome",
    "StartResult",
    "StopResult",
    "WorkspaceLifecycle",
]

logger = logging.getLogger(__name__)

Materialise = Callable[[Path], Awaitable[None]]
"""Fills a workspace that has no snapshot (environment files, setup); the engine provides it."""


class LifecycleState(enum.Enum):
    NEW = "new"
    STARTED = "started"
    STOPPED = "stopped"
    SHUT_DOWN = "shut_down"


class StartOutcome(enum.Enum):
    REUSED = "reused"
    RESTORED = "restored"
    FRESH = "fresh"


@dataclass(frozen=True, slots=True)
class StartResult:
    outcome: StartOutcome
    snapshot: SnapshotInfo | None
    duration_s: float


@dataclass(frozen=True, slots=True)
class StopResult:
    """`snapshot` is None when the store keeps nothing (the no-op store)."""

    snapshot: SnapshotInfo | None
    duration_s: float
    skipped: tuple[str, ...] = ()


class WorkspaceLifecycle:
    def __init__(
        self,
        *,
        store: SnapshotStore,
        scope: SnapshotScope,
        workspace: Path,
        manifest_digest: str,
        exclusions: Exclusions | None = None,
        state_path: Path | None = None,
        materialise: Materialise | None = None,
    ) -> None:
        self.store = store
        self.scope = scope
        self.workspace = workspace
        self.manifest_digest = manifest_digest
        self.exclusions = exclusions or Exclusions()
        self.state_path = state_path or workspace.parent / f".{workspace.name}.cairn-state.json"
        self._materialise = materialise
        self._state = LifecycleState.NEW
        self._lock = anyio.Lock()
        self._stat_cache = StatCache()
        self._saved: workspace_state.CachedFingerprint | None = None
        self._snapshot_id: SnapshotId | None = None

    @property
    def state(self) -> LifecycleState:
        return self._state

    def _require(self, verb: str, *allowed: LifecycleState) -> None:
        if self._state not in allowed:
            raise LifecycleStateError(
                f"workspace lifecycle of session {self.scope.session_id}: {verb}() is not allowed "
                f"in state {self._state.value!r} (allowed: {', '.join(state.value for state in allowed)})"
            )

    async def start(self, *, snapshot_id: SnapshotId | None = None, progress: Progress | None = None) -> StartResult:
        """Reuse, restore or materialise the workspace; `snapshot_id` selects an older snapshot."""
        async with self._lock:
            self._require("start", LifecycleState.NEW, LifecycleState.STOPPED)
            began = time.monotonic()
            target = await self._target(snapshot_id)
            if target is None:
                # No snapshot: a workspace left on disk may still have a valid stat cache.
                self._adopt(await run_sync(workspace_state.load_best_effort, self.state_path))
                await run_sync(self.workspace.mkdir, parents=True, exist_ok=True)
                if self._materialise is not None:
                    await self._materialise(self.workspace)
                outcome = StartOutcome.FRESH
            elif await self._is_current(target):
                outcome = StartOutcome.REUSED
            else:
                # Drop the cache before touching the workspace: if the restore dies half-way,
                # nothing claims that the workspace still matches a snapshot.
                await run_sync(workspace_state.drop_best_effort, self.state_path)
                self._saved = None
                restored = await self.store.restore(
                    self.scope,
                    self.workspace,
                    snapshot_id=SnapshotId(target.snapshot_id),
                    exclusions=self.exclusions,
                    progress=progress,
                )
                await self._remember(restored.snapshot, restored.stat_cache)
                outcome = StartOutcome.RESTORED
            self._state = LifecycleState.STARTED
            return StartResult(outcome=outcome, snapshot=target, duration_s=time.monotonic() - began)

    def _adopt(self, cached: workspace_state.CachedFingerprint | None) -> None:
        """Take the cache file's stat cache as ours; `_saved` is what the file says now."""
        if cached is not None:
            self._stat_cache = cached.stat_cache
        self._saved = cached

    async def _target(self, snapshot_id: SnapshotId | None) -> SnapshotInfo | None:
        if snapshot_id is not None:
            return await self.store.get_snapshot(self.scope, snapshot_id)
        # `latest` is None exactly when nothing is restorable (the no-op store lists nothing).
        return await self.store.latest(self.scope)

    async def _is_current(self, target: SnapshotInfo) -> bool:
        if target.fingerprint_version != FINGERPRINT_VERSION or target.manifest_digest != self.manifest_digest:
            return False
        try:
            # One worker-thread hop for the cache file and the whole live fingerprint: on a busy
            # host each hop costs milliseconds.
            cached, live = await run_sync(self._live_fingerprint, target)
        except (CairnError, OSError) as error:
            logger.warning(
                "session %s: live fingerprint failed (%s); restoring instead of reusing", self.scope.session_id, error
            )
            return False
        self._adopt(cached)
        if live is None or live.fingerprint != target.fingerprint:
            return False
        await self._remember(target, live.stat_cache, live.stat_listing)
        return True

    def _live_fingerprint(
        self, target: SnapshotInfo
    ) -> tuple[workspace_state.CachedFingerprint | None, LiveFingerprint | None]:
        cached = workspace_state.load_best_effort(self.state_path)
        if not self.workspace.is_dir():
            return cached, None
        if cached is not None and self._listed_unchanged(cached, target):
            return cached, LiveFingerprint(cached.fingerprint, cached.stat_cache, cached.stat_listing)
        stat_cache = cached.stat_cache if cached is not None else self._stat_cache
        return cached, fingerprint_workspace(self.workspace, self.exclusions, stat_cache, self.manifest_digest)

    def _listed_unchanged(self, cached: workspace_state.CachedFingerprint, target: SnapshotInfo) -> bool:
        """Whether a stat walk finds exactly the tree whose fingerprint is cached (and targeted)."""
        if cached.stat_listing is None or cached.fingerprint != target.fingerprint:
            return False
        if cached.manifest_digest != self.manifest_digest:
            return False
        return list_workspace(self.workspace, self.exclusions, time.time_ns()) == cached.stat_listing

    async def _remember(self, snapshot: SnapshotInfo, stat_cache: StatCache, stat_listing: str | None = None) -> None:
        self._stat_cache = stat_cache
        self._snapshot_id = SnapshotId(snapshot.snapshot_id)
        cached = workspace_state.CachedFingerprint(
            snapshot_id=snapshot.snapshot_id,
            fingerprint=snapshot.fingerprint,
            fingerprint_version=snapshot.fingerprint_version,
            manifest_digest=snapshot.manifest_digest,
            stat_cache=stat_cache,
            stat_listing=stat_listing,
        )
        if cached == self._saved:
            return  # an unchanged workspace reused: the file on disk already says exactly this
        await run_sync(workspace_state.save_best_effort, self.state_path, cached)
        self._saved = cached

    async def stop(self, *, progress: Progress | None = None) -> StopResult:
        """Persist the workspace as a new snapshot. Only persists: nothing is released."""
        async with self._lock:
            self._require("stop", LifecycleState.STARTED)
            began = time.monotonic()
            request = PersistRequest(
                scope=self.scope,
                workspace=self.workspace,
                manifest_digest=self.manifest_digest,
                exclusions=self.exclusions,
                stat_cache=self._stat_cache,
                parent_id=self._snapshot_id,
                progress=progress,
            )
            try:
                result = await self.store.persist(request)
            except BaseException as error:
                self._stat_cache = StatCache()
                await run_sync(workspace_state.drop_best_effort, self.state_path)
                self._saved = None
                if isinstance(error, Exception) and not isinstance(error, PersistFailedError):
                    raise PersistFailedError(f"persist failed: {error}") from error
                raise
            if result is None:
                await run_sync(workspace_state.drop_best_effort, self.state_path)
                self._saved = None
                self._state = LifecycleState.STOPPED
                return StopResult(snapshot=None, duration_s=time.monotonic() - began)
            await self._remember(result.snapshot, result.stat_cache, result.stat_listing)
            self._state = LifecycleState.STOPPED
            return StopResult(snapshot=result.snapshot, duration_s=time.monotonic() - began, skipped=result.skipped)

    async def shutdown(self) -> None:
        """Release in-memory state. Idempotent; the workspace files and the cache file stay."""
        async with self._lock:
            self._stat_cache = StatCache()
            self._state = LifecycleState.SHUT_DOWN
