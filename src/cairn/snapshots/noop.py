"""The no-op `SnapshotStore`: for deployments that keep no workspace files between sandboxes.

`persist` stores nothing (and says so by returning None), `restorable` is always false and
`restore` raises `SnapshotNotRestorableError`, so the lifecycle takes the "fresh" branch and
never mistakes an empty store for a restorable one.
"""

from __future__ import annotations

from pathlib import Path

from cairn.snapshots.base import RestoreResult, SnapshotStore
from cairn.snapshots.errors import SnapshotNotFoundError, SnapshotNotRestorableError
from cairn.snapshots.exclusions import Exclusions
from cairn.snapshots.gc import GcReport, Retention
from cairn.snapshots.ids import SnapshotId, SnapshotScope
from cairn.snapshots.models import SnapshotInfo
from cairn.snapshots.persist import PersistRequest, Progress

__all__ = ["NoopSnapshotStore"]


class NoopSnapshotStore(SnapshotStore):
    name = "none"

    async def persist(self, request: PersistRequest) -> None:
        return None

    async def restore(
        self,
        scope: SnapshotScope,
        workspace: Path,
        *,
        snapshot_id: SnapshotId | None = None,
        exclusions: Exclusions | None = None,
        progress: Progress | None = None,
    ) -> RestoreResult:
        raise SnapshotNotRestorableError(
            "this deployment keeps no workspace snapshots (snapshot store 'none')",
            context={"session_id": scope.session_id},
        )

    async def restorable(self, scope: SnapshotScope, snapshot_id: SnapshotId | None = None) -> bool:
        return False

    async def list_snapshots(self, scope: SnapshotScope) -> list[SnapshotInfo]:
        return []

    async def get_snapshot(self, scope: SnapshotScope, snapshot_id: SnapshotId) -> SnapshotInfo:
        raise SnapshotNotFoundError(
            f"session {scope.session_id} has no snapshot {snapshot_id!r} (snapshot store 'none')",
            param="snapshot_id",
        )

    async def forget(self, scope: SnapshotScope) -> int:
        return 0

    async def gc(self, tenant_id: str, retention: Retention, *, grace_s: float = 3600.0) -> GcReport:
        return GcReport()
