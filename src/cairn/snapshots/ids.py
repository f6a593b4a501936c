"""Snapshot ids and the scope (tenant, session) that owns a snapshot.

Ids, tenant ids and session ids all become one segment of a storage key or file path, so
each is validated as a single path segment before it gets near a store (design invariant 7):
not empty, not `.` or `..`, no separator, no NUL, printable ASCII only.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from typing import NewType

from cairn.snapshots.errors import InvalidSnapshotIdError

__all__ = ["SnapshotId", "SnapshotScope", "new_snapshot_id", "validate_segment", "parse_snapshot_id"]

SnapshotId = NewType("SnapshotId", str)

# Conservative on purpose: the same segment must be a valid S3 key part, file name and URL
# path component without any escaping.
_SEGMENT = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


def validate_segment(value: str, *, what: str) -> str:
    """Return `value` if it is a safe single path segment, else raise `InvalidSnapshotIdError`."""
    if value in {".", ".."} or not _SEGMENT.fullmatch(value):
        raise InvalidSnapshotIdError(
            f"{what} {value!r} is not a single path segment "
            "(1-128 characters from A-Z a-z 0-9 _ . -, not '.' or '..')",
            param=what.replace(" ", "_"),
        )
    return value


def parse_snapshot_id(value: str) -> SnapshotId:
    return SnapshotId(validate_segment(value, what="snapshot id"))


def new_snapshot_id() -> SnapshotId:
    """A fresh id that sorts by creation time, so the latest snapshot is the greatest id."""
    return SnapshotId(f"snap_{time.time_ns():020d}_{secrets.token_hex(4)}")


@dataclass(frozen=True, slots=True)
class SnapshotScope:
    """Who owns a snapshot. Content is shared within a tenant, snapshots are listed per session."""

    tenant_id: str
    session_id: str

    def __post_init__(self) -> None:
        validate_segment(self.tenant_id, what="tenant id")
        validate_segment(self.session_id, what="session id")
