"""Workspace snapshots: persist on stop, restore on start, skip by fingerprint.

Public surface (see docs/snapshots.md): the `SnapshotStore` interface and its backends
(content-addressed over a local directory or S3, and no-op), `open_snapshot_store` to pick one
from settings, the `WorkspaceLifecycle` the engine drives, and the `snapshots` CLI commands.
The S3 transport lives in `cairn.snapshots.s3_objects` and is imported only when chosen.
"""

from __future__ import annotations

from cairn.snapshots.base import RestoreResult, SnapshotStore
from cairn.snapshots.cli import add_snapshot_commands
from cairn.snapshots.config import SnapshotStoreConfig, open_snapshot_store
from cairn.snapshots.content_store import ContentAddressedSnapshotStore
from cairn.snapshots.errors import (
    InvalidExclusionError,
    InvalidSnapshotIdError,
    LifecycleStateError,
    ObjectMissingError,
    PersistFailedError,
    RestoreIncompleteError,
    SnapshotCorruptError,
    SnapshotError,
    SnapshotNotFoundError,
    SnapshotNotRestorableError,
    SnapshotStoreUnavailableError,
)
from cairn.snapshots.exclusions import Exclusions
from cairn.snapshots.fingerprint import FINGERPRINT_VERSION, environment_manifest_digest
from cairn.snapshots.gc import GcReport, Retention
from cairn.snapshots.ids import SnapshotId, SnapshotScope, parse_snapshot_id
from cairn.snapshots.lifecycle import (
    LifecycleState,
    Materialise,
    StartOutcome,
    StartResult,
    StopResult,
    WorkspaceLifecycle,
)
from cairn.snapshots.local_objects import LocalObjectStore
from cairn.snapshots.models import SnapshotInfo
from cairn.snapshots.noop import NoopSnapshotStore
from cairn.snapshots.objects import ObjectStore
from cairn.snapshots.persist import PersistRequest, PersistResult, Progress

__all__ = [
    "FINGERPRINT_VERSION",
    "ContentAddressedSnapshotStore",
    "Exclusions",
    "GcReport",
    "InvalidExclusionError",
    "InvalidSnapshotIdError",
    "LifecycleState",
    "LifecycleStateError",
    "LocalObjectStore",
    "Materialise",
    "NoopSnapshotStore",
    "ObjectMissingError",
    "ObjectStore",
    "PersistFailedError",
    "PersistRequest",
    "PersistResult",
    "Progress",
    "RestoreIncompleteError",
    "RestoreResult",
    "Retention",
    "SnapshotCorruptError",
    "SnapshotError",
    "SnapshotId",
    "SnapshotInfo",
    "SnapshotNotFoundError",
    "SnapshotNotRestorableError",
    "SnapshotScope",
    "SnapshotStore",
    "SnapshotStoreConfig",
    "SnapshotStoreUnavailableError",
    "StartOutcome",
    "StartResult",
    "StopResult",
    "WorkspaceLifecycle",
    "add_snapshot_commands",
    "environment_manifest_digest",
    "open_snapshot_store",
    "parse_snapshot_id",
]
