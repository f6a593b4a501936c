"""Packs: many blobs in one object, so that 2,000 small files cost one write and one fsync.

A pack is the concatenation of blobs, then its `PackIndex` as JSON, then a 16-byte footer
(index length, magic). Because the index travels inside the pack, a committed pack is always
self-describing and there is no second object that could be missing or stale. Blobs are
addressed by the sha256 of their stored bytes; a tenant's `BlobIndex` maps each digest to one
location in a live pack, which is what makes storage incremental within a session and across
the sessions of a tenant. Packs marked for deletion by garbage collection (condemned) are left
out of the index, so a new snapshot never starts to depend on one (see `gc`).
"""

from __future__ import annotations

import secrets
import struct
import threading
from typing import NamedTuple

from cairn.snapshots import layout
from cairn.snapshots.errors import SnapshotCorruptError
from cairn.snapshots.models import PackIndex
from cairn.snapshots.objects import ObjectStore, ObjectWriter

__all__ = ["BlobIndex", "PackWriter", "StoredBlob", "read_pack_index"]

_MAGIC = b"CAIRNPK1"
_FOOTER = struct.Struct(">Q8s")


class StoredBlob(NamedTuple):
    """Where a blob lives: the fields of a tree's `BlobLocation`, without a pydantic model.

    A persist makes one per new file and the tenant index one per known blob; building a
    model for each (even with `model_construct`) cost more than hashing the file's bytes.
    """

    digest: str
    pack: str
    offset: int
    length: int


class PackWriter:
    """Appends blobs to one new pack; nothing is visible until `commit()`."""

    def __init__(self, objects: ObjectStore, tenant_id: str, *, size_hint: int | None = None) -> None:
        self.pack_id = secrets.token_hex(16)
        self._writer: ObjectWriter = objects.open_writer(layout.pack_key(tenant_id, self.pack_id), size_hint=size_hint)
        self._blobs: list[tuple[str, int, int]] = []
        self._blob_start = 0

    @property
    def size(self) -> int:
        return self._writer.size

    def write(self, data: bytes | memoryview) -> None:
        """Append bytes of the blob being written; `end_blob` names them."""
        self._writer.write(data)

    def end_blob(self, digest: str) -> StoredBlob:
        offset, length = self._blob_start, self._writer.size - self._blob_start
        self._blobs.append((digest, offset, length))
        self._blob_start = self._writer.size
        return StoredBlob(digest, self.pack_id, offset, length)

    def commit(self) -> PackIndex:
        index = PackIndex(pack_id=self.pack_id, pack_bytes=self._writer.size, blobs=tuple(self._blobs))
        encoded = index.model_dump_json().encode()
        self._writer.write(encoded)
        self._writer.write(_FOOTER.pack(len(encoded), _MAGIC))
        self._writer.commit()
        return index

    def abort(self) -> None:
        self._writer.abort()


def read_pack_index(objects: ObjectStore, tenant_id: str, pack_id: str, size: int) -> PackIndex:
    key = layout.pack_key(tenant_id, pack_id)
    if size < _FOOTER.size:
        raise SnapshotCorruptError(f"pack {pack_id} is truncated ({size} bytes)", context={"key": key})
    length, magic = _FOOTER.unpack(_read_exact(objects, key, size - _FOOTER.size, _FOOTER.size))
    if magic != _MAGIC or length > size - _FOOTER.size:
        raise SnapshotCorruptError(f"pack {pack_id} has no valid index footer", context={"key": key})
    raw = _read_exact(objects, key, size - _FOOTER.size - length, length)
    try:
        index = PackIndex.model_validate_json(raw)
    except ValueError as error:
        raise SnapshotCorruptError(f"pack {pack_id} has an unreadable index", context={"key": key}) from error
    if index.pack_id != pack_id:
        raise SnapshotCorruptError(f"pack {pack_id} carries the index of {index.pack_id}", context={"key": key})
    return index


def _read_exact(objects: ObjectStore, key: str, offset: int, length: int) -> bytes:
    reader = objects.open_reader(key, offset, length)
    try:
        data = reader.read(length)
    finally:
        reader.close()
    if len(data) != length:
        raise SnapshotCorruptError(f"object {key!r} is shorter than expected", context={"key": key})
    return data


class BlobIndex:
    """digest → location over a tenant's live packs, refreshed incrementally before each persist.

    Thread-safe: the persists of several sessions of one tenant share it.
    """

    def __init__(self, tenant_id: str) -> None:
        self.tenant_id = tenant_id
        self._lock = threading.Lock()
        self._packs: dict[str, PackIndex] = {}
        self._active: set[str] = set()
        self._locations: dict[str, StoredBlob] = {}

    def refresh(self, objects: ObjectStore) -> None:
        listed = {
            info.key[len(layout.packs_prefix(self.tenant_id)) : -len(layout.PACK_SUFFIX)]: info.size
            for info in objects.list(layout.packs_prefix(self.tenant_id))
            if info.key.endswith(layout.PACK_SUFFIX)
        }
        condemned = {
            info.key[len(layout.condemned_prefix(self.tenant_id)) :]
            for info in objects.list(layout.condemned_prefix(self.tenant_id))
        }
        unknown = [pack_id for pack_id in listed if pack_id not in self._packs]
        loaded = {pack_id: read_pack_index(objects, self.tenant_id, pack_id, listed[pack_id]) for pack_id in unknown}
        with self._lock:
            self._packs.update(loaded)
            active = {pack_id for pack_id in listed if pack_id not in condemned}
            if self._active - active:
                # A pack went away or was condemned: rebuild rather than guess which digests moved.
                self._packs = {pack_id: self._packs[pack_id] for pack_id in listed}
                self._locations = {}
                self._active = set()
            for pack_id in sorted(active - self._active):
                self._add(self._packs[pack_id])
            self._active = active

    def _add(self, index: PackIndex) -> None:
        pack_id = index.pack_id
        locations = self._locations
        for digest, offset, length in index.blobs:
            if digest not in locations:
                locations[digest] = StoredBlob(digest, pack_id, offset, length)

    def get(self, digest: str) -> StoredBlob | None:
        with self._lock:
            return self._locations.get(digest)

    def add_pack(self, index: PackIndex) -> None:
        """Record a pack this process committed, without waiting for the next refresh."""
        with self._lock:
            self._packs[index.pack_id] = index
            self._active.add(index.pack_id)
            self._add(index)
