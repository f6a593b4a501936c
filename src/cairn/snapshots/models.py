"""The persisted documents of a snapshot store: snapshot header, tree entries, pack index.

A snapshot is two immutable objects: a *tree* (one JSON line per workspace entry, in path
order, naming the content blob of every file) and a *header* (this `SnapshotInfo`), which is
written last and is the commit point: a snapshot without a header does not exist. The header
carries the tree's sha256, so a truncated or altered tree is detected before a restore
touches anything, and the list of packs the tree references, so garbage collection never has
to read trees. Documents are frozen pydantic models that reject unknown keys (style: data at
boundaries); `FORMAT_VERSION` is bumped on any incompatible change.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "FORMAT_VERSION",
    "BlobLocation",
    "EntryKind",
    "PackIndex",
    "RootMeta",
    "SnapshotInfo",
    "TreeEntry",
]

FORMAT_VERSION: Literal[1] = 1

EntryKind = Literal["dir", "file", "symlink", "hardlink", "fifo"]


class _Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BlobLocation(_Document):
    """Where a file's stored bytes live: `length` bytes at `offset` of pack `pack`."""

    digest: str
    pack: str
    offset: int = Field(ge=0)
    length: int = Field(ge=0)


class TreeEntry(_Document):
    """One workspace entry. `path` is relative, `/`-separated, never empty, `.` or `..`.

    `target` is the link text of a symlink (kept verbatim and never followed) or, for a
    hardlink, the path of the first entry of its link group. A sparse file stores only its
    data `extents` (offset, length) in its blob; holes are recreated by truncation.
    """

    path: str
    kind: EntryKind
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    size: int = 0
    blob: BlobLocation | None = None
    extents: tuple[tuple[int, int], ...] | None = None
    target: str | None = None

    @property
    def digest(self) -> str | None:
        return self.blob.digest if self.blob is not None else None


class RootMeta(_Document):
    mode: int
    uid: int
    gid: int
    mtime_ns: int


class SnapshotInfo(_Document):
    """The header of one immutable snapshot, as listed by `cairn snapshots list|show`."""

    format: Literal[1] = FORMAT_VERSION
    snapshot_id: str
    tenant_id: str
    session_id: str
    created_at: datetime
    parent_id: str | None
    fingerprint: str
    fingerprint_version: str
    manifest_digest: str
    tree_sha256: str
    tree_bytes: int
    root: RootMeta
    entry_count: int
    file_count: int
    total_bytes: int
    new_bytes: int
    packs: tuple[str, ...]


class PackIndex(_Document):
    """The blobs of one pack, written after the pack so that an index implies a complete pack."""

    format: Literal[1] = FORMAT_VERSION
    pack_id: str
    pack_bytes: int
    blobs: tuple[tuple[str, int, int], ...]
