"""The snapshot branch of Cairn's error tree.

Every failure that leaves `cairn.snapshots` is one of these; OS, boto and JSON errors are
translated at the boundary and chained with `raise ... from` (style: errors). The tree,
hung under `cairn.errors`:

    ServerError
    └── SnapshotError                    the snapshot store failed (persist, read, list, gc)
        ├── PersistFailedError           a persist did not commit; the previous snapshot stays
        ├── RestoreIncompleteError       a restore was abandoned; the workspace is as it was
        ├── SnapshotCorruptError         stored bytes do not match their recorded digest
        │   └── ObjectMissingError       an object the store refers to is gone
        └── SnapshotStoreUnavailableError  the backing directory or bucket cannot be reached
    NotFoundError
    └── SnapshotNotFoundError            no snapshot with this id in this session
    ConflictError
    └── SnapshotNotRestorableError       the store keeps nothing (no-op) or the session has none
    InvalidRequestError
    ├── InvalidSnapshotIdError           an id that is not a single path segment
    └── InvalidExclusionError            an exclusion that escapes the workspace or overlaps a mount
    CairnMisuseError
    └── LifecycleStateError              a lifecycle verb called in the wrong state (a bug)
"""

from __future__ import annotations

from cairn.errors import (
    CairnMisuseError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    ServerError,
)

__all__ = [
    "ObjectMissingError",
    "InvalidExclusionError",
    "InvalidSnapshotIdError",
    "LifecycleStateError",
    "PersistFailedError",
    "RestoreIncompleteError",
    "SnapshotCorruptError",
    "SnapshotError",
    "SnapshotNotFoundError",
    "SnapshotNotRestorableError",
    "SnapshotStoreUnavailableError",
]


class SnapshotError(ServerError):
    default_code = "snapshot_error"


class PersistFailedError(SnapshotError):
    """Design invariant 7: nothing was committed, the previous snapshot is still the latest."""

    default_code = "snapshot_persist_failed"
    default_retryable = True


class RestoreIncompleteError(SnapshotError):
    """Design invariant 7: the restore stopped before touching the workspace, or was rolled back."""

    default_code = "restore_incomplete"


class SnapshotCorruptError(SnapshotError):
    default_code = "snapshot_corrupt"
    default_retryable = False


class ObjectMissingError(SnapshotCorruptError):
    default_code = "snapshot_object_missing"


class SnapshotStoreUnavailableError(SnapshotError):
    default_code = "snapshot_store_unavailable"
    default_status = 503
    default_retryable = True


class SnapshotNotFoundError(NotFoundError):
    default_code = "snapshot_not_found"


class SnapshotNotRestorableError(ConflictError):
    """Raised by `restore` when there is nothing to restore; `restorable()` predicts it."""

    default_code = "snapshot_not_restorable"


class InvalidSnapshotIdError(InvalidRequestError):
    default_code = "invalid_snapshot_id"


class InvalidExclusionError(InvalidRequestError):
    default_code = "invalid_snapshot_exclusion"


class LifecycleStateError(CairnMisuseError):
    """A workspace lifecycle verb was called out of order, e.g. `stop()` before `start()`."""
