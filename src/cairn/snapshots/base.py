"""The snapshot store interface: persist, restore, restorable, and the listing they imply.

A `SnapshotStore` keeps the *files* of a workspace (design.md §1: a snapshot seeds a new
sandbox with old files; it is neither run state nor session state). One store is selected per
deployment: content-addressed over a local directory (default) or an S3-compatible bucket,
or the no-op store, which keeps nothing.

Invariants every implementation keeps (design invariant 7):
- a snapshot is immutable once listed; a persist creates a new one and never rewrites another;
- a persist that raises committed nothing: the previous snapshot is still the latest;
- a restore either leaves the workspace equal to the snapshot (plus excluded paths) or raises
  `RestoreIncompleteError` with the workspace as it was;
- snapshot ids, tenant ids and session ids are single path segments;
- no blocking call runs on the event loop, and no foreign exception escapes.
Optional features are declared in `capabilities`: "persist" (keeps snapshots), "gc".
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from cairn.snapshots.exclusions import Exclusions
from cairn.snapshots.gc import GcReport, Retention
from cairn.snapshots.ids import SnapshotId, SnapshotScope
from cairn.snapshots.models import SnapshotInfo
from cairn.snapshots.persist import PersistRequest, PersistResult, Progress
from cairn.snapshots.stat_cache import StatCache

__all__ = ["RestoreResult", "SnapshotStore"]


@dataclass(frozen=True, slots=True)
class RestoreResult:
    snapshot: SnapshotInfo
    stat_cache: StatCache


class SnapshotStore(abc.ABC):
    name: ClassVar[str]
    capabilities: ClassVar[frozenset[str]] = frozenset()

    @abc.abstractmethod
    async def persist(self, request: PersistRequest) -> PersistResult | None:
        """Store the workspace as a new snapshot; None when this store keeps nothing."""

    @abc.abstractmethod
    async def restore(
        self,
        scope: SnapshotScope,
        workspace: Path,
        *,
        snapshot_id: SnapshotId | None = None,
        exclusions: Exclusions | None = None,
        progress: Progress | None = None,
    ) -> RestoreResult:
        """Make `workspace` hold the snapshot (the latest by default) or raise; see invariants."""

    @abc.abstractmethod
    async def restorable(self, scope: SnapshotScope, snapshot_id: SnapshotId | None = None) -> bool:
        """Whether `restore` with the same arguments has something to restore."""

    @abc.abstractmethod
    async def list_snapshots(self, scope: SnapshotScope) -> list[SnapshotInfo]:
        """The session's snapshots, oldest first."""

    @abc.abstractmethod
    async def get_snapshot(self, scope: SnapshotScope, snapshot_id: SnapshotId) -> SnapshotInfo:
        """One snapshot's header; `SnapshotNotFoundError` if the session has no such snapshot."""

    @abc.abstractmethod
    async def gc(self, tenant_id: str, retention: Retention, *, grace_s: float = 3600.0) -> GcReport:
        """Apply `retention` to every session of the tenant and delete content nothing references.

        Content referenced by a kept snapshot is never deleted. Unreferenced content is first
        marked, and deleted by a later run once `grace_s` has passed, so a persist running
        concurrently (which may have chosen to reuse that content) is never broken as long as
        it takes less than `grace_s`.
        """

    @abc.abstractmethod
    async def forget(self, scope: SnapshotScope) -> int:
        """Delete every snapshot of a deleted session; return how many. Their content goes at the next `gc`."""

    async def latest(self, scope: SnapshotScope) -> SnapshotInfo | None:
        snapshots = await self.list_snapshots(scope)
        return snapshots[-1] if snapshots else None

    async def aclose(self) -> None:
        """Release threads and connections; no-op by default."""
