"""Persist: turn a live workspace into a new immutable snapshot, storing only new content.

Order of writes, which is what makes a `kill -9` at any point harmless (design invariant 7):
1. content packs (each a temp object renamed into place);
2. the tree, the header's list of every entry;
3. the header, the commit point. Until it exists, the new snapshot does not, the previous one
   is still the latest, and whatever 1-2 left behind is unreferenced garbage for `gc`.

Each file is read once: its bytes are hashed while they are copied into a pack. Files the stat
cache vouches for are not read at all, and content the tenant already stored (same digest) is
referenced, not copied. Small files share packs; a file above `SMALL_FILE_LIMIT` streams into
a pack of its own on a worker thread, which is aborted if its digest turns out to be known.
Memory is bounded by `SMALL_FILE_LIMIT` plus one chunk per worker, whatever the workspace size.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cairn.snapshots import layout
from cairn.snapshots._content import iter_stored_content, open_for_read, stored_length
from cairn.snapshots.errors import PersistFailedError
from cairn.snapshots.exclusions import Exclusions
from cairn.snapshots.fingerprint import FINGERPRINT_VERSION, compute_fingerprint
from cairn.snapshots.ids import SnapshotId, SnapshotScope, new_snapshot_id
from cairn.snapshots.models import BlobLocation, PackIndex, SnapshotInfo, TreeEntry
from cairn.snapshots.objects import ObjectStore
from cairn.snapshots.packs import BlobIndex, PackWriter
from cairn.snapshots.scan import ScannedEntry, scan_workspace
from cairn.snapshots.stat_cache import StatCache

__all__ = ["Progress", "PersistRequest", "PersistResult", "persist_workspace", "encode_tree_entry"]

SMALL_FILE_LIMIT = 8 * 1024 * 1024
SHARED_PACK_TARGET = 32 * 1024 * 1024
_PARALLEL_SMALL_FILES = 64

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes total) from a worker thread; must be cheap and thread-safe."""


@dataclass(frozen=True, slots=True)
class PersistRequest:
    scope: SnapshotScope
    workspace: Path
    manifest_digest: str
    exclusions: Exclusions = field(default_factory=Exclusions)
    stat_cache: StatCache = field(default_factory=StatCache)
    parent_id: SnapshotId | None = None
    progress: Progress | None = None


@dataclass(frozen=True, slots=True)
class PersistResult:
    snapshot: SnapshotInfo
    stat_cache: StatCache
    skipped: tuple[str, ...] = ()


class _ChangedWhileReadingError(Exception):
    pass


def encode_tree_entry(entry: TreeEntry) -> bytes:
    # stdlib json, not pydantic: file names that are not UTF-8 travel as surrogate escapes,
    # which pydantic's encoder rejects and `json` round-trips exactly.
    return json.dumps(entry.model_dump(exclude_none=True), separators=(",", ":")).encode() + b"\n"


class _Storer:
    """The content-storing half of one persist."""

    def __init__(self, objects: ObjectStore, index: BlobIndex, total: int, progress: Progress | None) -> None:
        self._objects = objects
        self._index = index
        self._lock = threading.Lock()
        self._pending: dict[str, BlobLocation] = {}
        self._shared: dict[int, PackWriter] = {}
        self._open_packs: set[PackWriter] = set()
        self.packs: list[PackIndex] = []
        self.new_bytes = 0
        self._done = 0
        self._total = total
        self._progress = progress

    def _known(self, digest: str) -> BlobLocation | None:
        with self._lock:
            return self._pending.get(digest) or self._index.get(digest)

    def _advance(self, amount: int) -> None:
        if self._progress is None:
            return
        with self._lock:
            self._done += amount
            done = self._done
        self._progress(done, self._total)

    def store_small_batch(self, root: str, entries: list[ScannedEntry], lane: int) -> list[BlobLocation]:
        """Store small files into this lane's shared pack; lanes run on different threads."""
        return [self.store_small(os.path.join(root, entry.path), entry, lane) for entry in entries]

    def store_small(self, path: str, entry: ScannedEntry, lane: int) -> BlobLocation:
        fd = open_for_read(path)
        try:
            data = b"".join(iter_stored_content(fd, entry))
            _check_unchanged(fd, entry)
        finally:
            os.close(fd)
        digest = hashlib.sha256(data).hexdigest()
        location = self._known(digest)
        if location is None:
            shared = self._shared.get(lane)
            if shared is None or shared.size >= SHARED_PACK_TARGET:
                if shared is not None:
                    self._close_pack(shared, commit=True)
                shared = self._shared[lane] = self._open_pack()
            shared.write(data)
            location = shared.end_blob(digest)
            with self._lock:
                self._pending[digest] = location
                self.new_bytes += len(data)
        self._advance(len(data))
        return location

    def store_large(self, path: str, entry: ScannedEntry) -> BlobLocation:
        pack = self._open_pack()
        try:
            fd = open_for_read(path)
            try:
                digest = hashlib.sha256()
                for chunk in iter_stored_content(fd, entry):
                    digest.update(chunk)
                    pack.write(chunk)
                    self._advance(len(chunk))
                _check_unchanged(fd, entry)
            finally:
                os.close(fd)
            hexdigest = digest.hexdigest()
            known = self._known(hexdigest)
            if known is not None:
                self._close_pack(pack, commit=False)
                return known
            location = pack.end_blob(hexdigest)
            self._close_pack(pack, commit=True)
        except BaseException:
            self._close_pack(pack, commit=False)
            raise
        with self._lock:
            self.new_bytes += location.length
            return self._pending.setdefault(hexdigest, location)

    def _open_pack(self) -> PackWriter:
        pack = PackWriter(self._objects, self._index.tenant_id)
        with self._lock:
            self._open_packs.add(pack)
        return pack

    def _close_pack(self, pack: PackWriter, *, commit: bool) -> None:
        with self._lock:
            if pack not in self._open_packs:
                return
            self._open_packs.discard(pack)
        if not commit:
            pack.abort()
            return
        index = pack.commit()
        with self._lock:
            self.packs.append(index)

    def finish(self) -> None:
        for shared in self._shared.values():
            self._close_pack(shared, commit=True)
        self._shared = {}
        # Packs join the tenant index only once committed, so no concurrent persist can come to
        # depend on bytes that might still be aborted.
        for index in self.packs:
            self._index.add_pack(index)

    def abort(self) -> None:
        with self._lock:
            packs, self._open_packs = list(self._open_packs), set()
        for pack in packs:
            pack.abort()


def _check_unchanged(fd: int, entry: ScannedEntry) -> None:
    st = os.fstat(fd)
    key = entry.stat_key
    if key is None or (st.st_size, st.st_mtime_ns, st.st_ctime_ns) != (key.size, key.mtime_ns, key.ctime_ns):
        raise _ChangedWhileReadingError(entry.path)


def persist_workspace(
    objects: ObjectStore, index: BlobIndex, executor: Executor, request: PersistRequest
) -> PersistResult:
    """Store the workspace as a new snapshot of `request.scope`; see the module docstring."""
    try:
        return _persist(objects, index, executor, request)
    except PersistFailedError:
        raise
    except _ChangedWhileReadingError as error:
        raise PersistFailedError(
            f"persist failed: {error.args[0]!r} changed while it was being stored; "
            "stop every process in the sandbox before persisting",
            context={"path": error.args[0]},
        ) from error
    except Exception as error:
        raise PersistFailedError(f"persist failed: {error}", retryable=getattr(error, "retryable", None)) from error


def _persist(objects: ObjectStore, index: BlobIndex, executor: Executor, request: PersistRequest) -> PersistResult:
    scope = request.scope
    index.refresh(objects)
    scan = scan_workspace(request.workspace, request.exclusions, request.stat_cache)
    locations: dict[str, BlobLocation] = {}
    to_store: list[ScannedEntry] = []
    for entry in scan.entries:
        if entry.kind != "file" or stored_length(entry) == 0:
            continue
        known = index.get(entry.digest) if entry.digest is not None else None
        if known is None:
            to_store.append(entry)
        else:
            locations[entry.path] = known
    storer = _Storer(objects, index, sum(stored_length(entry) for entry in to_store), request.progress)
    root = str(request.workspace)
    small = [entry for entry in to_store if stored_length(entry) <= SMALL_FILE_LIMIT]
    # Half of the small files go to a worker, half stay on this thread: opening files costs
    # more than reading them here, and the two halves overlap. Large files queue behind.
    half = len(small) // 2 if len(small) >= _PARALLEL_SMALL_FILES else 0
    futures: list[Future[Any]] = []
    try:
        other_half = executor.submit(storer.store_small_batch, root, small[:half], 1)
        futures.append(other_half)
        large = [
            (entry, executor.submit(storer.store_large, os.path.join(root, entry.path), entry))
            for entry in to_store
            if stored_length(entry) > SMALL_FILE_LIMIT
        ]
        futures.extend(future for _entry, future in large)
        for entry, stored in zip(small[half:], storer.store_small_batch(root, small[half:], 0), strict=True):
            locations[entry.path] = stored
        for entry, stored in zip(small[:half], other_half.result(), strict=True):
            locations[entry.path] = stored
        for entry, future in large:
            locations[entry.path] = future.result()
        storer.finish()
    except BaseException:
        for future in futures:
            future.cancel()
        for future in futures:
            # A running worker must finish (or fail) before its pack can be aborted.
            if not future.cancelled():
                future.exception()
        storer.abort()
        raise

    snapshot_id = new_snapshot_id()
    tree_entries = [_tree_entry(entry, locations.get(entry.path)) for entry in scan.entries]
    tree_digest = hashlib.sha256()
    with objects.open_writer(layout.tree_key(scope, snapshot_id)) as tree:
        for tree_entry in tree_entries:
            line = encode_tree_entry(tree_entry)
            tree_digest.update(line)
            tree.write(line)
        tree.commit()
    info = SnapshotInfo(
        snapshot_id=snapshot_id,
        tenant_id=scope.tenant_id,
        session_id=scope.session_id,
        created_at=datetime.now(UTC),
        parent_id=request.parent_id,
        fingerprint=compute_fingerprint(tree_entries, scan.root, request.manifest_digest),
        fingerprint_version=FINGERPRINT_VERSION,
        manifest_digest=request.manifest_digest,
        tree_sha256=tree_digest.hexdigest(),
        tree_bytes=tree.size,
        root=scan.root,
        entry_count=len(tree_entries),
        file_count=sum(1 for entry in tree_entries if entry.kind == "file"),
        total_bytes=sum(entry.size for entry in tree_entries if entry.kind == "file"),
        new_bytes=storer.new_bytes,
        packs=tuple(sorted({location.pack for location in locations.values()})),
    )
    objects.put_bytes(layout.header_key(scope, snapshot_id), info.model_dump_json(indent=1).encode())
    observations = [
        (entry.path, entry.stat_key, location.digest)
        for entry in scan.entries
        if entry.stat_key is not None and (location := locations.get(entry.path)) is not None
    ]
    return PersistResult(
        snapshot=info,
        stat_cache=StatCache.from_observations(observations, scan_started_ns=scan.started_ns),
        skipped=tuple(scan.skipped),
    )


def _tree_entry(entry: ScannedEntry, location: BlobLocation | None) -> TreeEntry:
    # model_construct: every field comes from lstat or from this persist, nothing to validate.
    return TreeEntry.model_construct(
        path=entry.path,
        kind=entry.kind,
        mode=entry.mode,
        uid=entry.uid,
        gid=entry.gid,
        mtime_ns=entry.mtime_ns,
        size=entry.size,
        blob=location,
        extents=entry.extents,
        target=entry.target,
    )
