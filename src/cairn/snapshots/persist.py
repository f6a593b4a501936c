"""Persist: turn a live workspace into a new immutable snapshot, storing only new content.

Order of writes, which is what makes a `kill -9` at any point harmless (design invariant 7):
1. content packs and the tree (the header's list of every entry), each a temp object
   committed (made durable and renamed into place) side by side once all content is stored;
2. the header, the commit point, only once every object of 1 is committed. Until it exists,
   the new snapshot does not, the previous one is still the latest, and whatever 1 left
   behind is unreferenced garbage for `gc`.

Each file is read once: its bytes are hashed while they are copied into a pack. Files the stat
cache vouches for are not read at all, and content the tenant already stored (same digest) is
referenced, not copied. Small files share packs; a file above `SMALL_FILE_LIMIT` streams into
a pack of its own on a worker thread, which is aborted if its digest turns out to be known.
Memory is bounded by `SMALL_FILE_LIMIT` plus one chunk per worker, and by the write buffers of
at most `_MAX_FILLED_PACKS` filled packs plus one per worker, whatever the workspace size.
"""

from __future__ import annotations

import functools
import hashlib
import json
import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cairn.snapshots import layout
from cairn.snapshots._content import iter_stored_content_into, open_for_read, read_small_content, stored_length
from cairn.snapshots._direct_io import aligned_buffer
from cairn.snapshots._parallel import run_calls, run_tasks
from cairn.snapshots.errors import PersistFailedError
from cairn.snapshots.exclusions import Exclusions
from cairn.snapshots.fingerprint import FINGERPRINT_VERSION, fingerprint_of_rows, fingerprint_row
from cairn.snapshots.ids import SnapshotId, SnapshotScope, new_snapshot_id
from cairn.snapshots.models import BlobLocation, PackIndex, SnapshotInfo, TreeEntry
from cairn.snapshots.objects import ObjectStore, ObjectWriter
from cairn.snapshots.packs import BlobIndex, PackWriter, StoredBlob
from cairn.snapshots.scan import ScannedEntry, WorkspaceScan, scan_workspace
from cairn.snapshots.stat_cache import StatCache

__all__ = ["Progress", "PersistRequest", "PersistResult", "persist_workspace", "encode_tree_entry"]

SMALL_FILE_LIMIT = 8 * 1024 * 1024
SHARED_PACK_TARGET = 32 * 1024 * 1024
# Small files are handed to threads in batches of about this many bytes (one task each).
# Not by count: per file, storing is a few short system calls and some Python, and two
# threads doing that take turns on the GIL at a cost above the work itself (2,000 files of
# 1-8 KiB: 0.15-0.17 s on one thread, 0.21-0.25 s on three). Batches of bigger files are
# mostly hashing, which runs without the GIL, so those do spread over the threads.
# A batch closes once it reaches this, so it fills one shared pack (up to one file beyond it).
_SMALL_BATCH_BYTES = SHARED_PACK_TARGET
# Filled packs wait to be committed together at the end, so that their fsyncs overlap; past
# this many, the oldest is committed at once by the thread that filled the newest. Each open
# pack holds a file (and its 256 KiB buffer) or, on S3, up to a part of unsent bytes.
_MAX_FILLED_PACKS = 8
_COPY_CHUNK = 1024 * 1024

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
    stat_listing: str | None = None
    """The listing digest of the scan the snapshot was made from (`stat_listing`); None when racy."""


class _ChangedWhileReadingError(Exception):
    pass


_encode_json = json.JSONEncoder(separators=(",", ":")).encode


def encode_tree_entry(entry: TreeEntry) -> bytes:
    """One tree line: the fields of `entry.model_dump(exclude_none=True)`, in that order."""
    return _encode_line(entry, entry.blob)


def _encode_line(entry: TreeEntry | ScannedEntry, blob: BlobLocation | StoredBlob | None) -> bytes:
    # stdlib json, not pydantic: file names that are not UTF-8 travel as surrogate escapes,
    # which pydantic's encoder rejects and `json` round-trips exactly. Building the dict by
    # hand is ~10x cheaper than `model_dump`, which matters at thousands of entries a persist.
    record: dict[str, object] = {
        "path": entry.path,
        "kind": entry.kind,
        "mode": entry.mode,
        "uid": entry.uid,
        "gid": entry.gid,
        "mtime_ns": entry.mtime_ns,
        "size": entry.size,
    }
    if blob is not None:
        record["blob"] = {"digest": blob.digest, "pack": blob.pack, "offset": blob.offset, "length": blob.length}
    if entry.extents is not None:
        record["extents"] = entry.extents
    if entry.target is not None:
        record["target"] = entry.target
    return _encode_json(record).encode() + b"\n"


class _EncodedEntries:
    """Tree lines and fingerprint rows, each encoded by the task that learned its entry's blob.

    Encoding is Python work under the GIL (~15 ms for 2,000 entries). Left to the end, it waited
    for the last large file; done by each task, it runs while the lanes storing large files wait
    on the disk, and the end only joins the lines and hashes the rows in path order.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: dict[str, bytes] = {}
        self._rows: dict[str, list[Any]] = {}

    def add(self, entries: list[ScannedEntry], locations: dict[str, StoredBlob]) -> None:
        lines: dict[str, bytes] = {}
        rows: dict[str, list[Any]] = {}
        for entry in entries:
            location = locations.get(entry.path)
            # What the tree records is what the fingerprint hashes (it reads `digest`).
            entry.digest = location.digest if location is not None else None
            lines[entry.path] = _encode_line(entry, location)
            rows[entry.path] = fingerprint_row(entry)
        with self._lock:
            self._lines.update(lines)
            self._rows.update(rows)

    def lines(self, entries: list[ScannedEntry]) -> list[bytes]:
        return [self._lines[entry.path] for entry in entries]

    def rows(self, entries: list[ScannedEntry]) -> list[list[Any]]:
        return [self._rows[entry.path] for entry in entries]


class _Storer:
    """The content-storing half of one persist.

    Packs are filled while content is hashed and the last `_MAX_FILLED_PACKS` of them are
    committed together afterwards (`commits()`), so their fsyncs wait on the disk side by
    side, next to the tree's.
    """

    def __init__(self, objects: ObjectStore, index: BlobIndex, total: int, progress: Progress | None) -> None:
        self._objects = objects
        self._index = index
        self._lock = threading.Lock()
        self._pending: dict[str, StoredBlob] = {}
        self._open_packs: set[PackWriter] = set()
        self._filled: list[PackWriter] = []  # open packs that take no more blobs, oldest first
        self.packs: list[PackIndex] = []
        self.new_bytes = 0
        self._done = 0
        self._total = total
        self._progress = progress

    def _known(self, digest: str) -> StoredBlob | None:
        with self._lock:
            return self._pending.get(digest) or self._index.get(digest)

    def _advance(self, amount: int) -> None:
        if self._progress is None:
            return
        with self._lock:
            self._done += amount
            done = self._done
        self._progress(done, self._total)

    def store_small_batch(self, root: str, entries: list[ScannedEntry]) -> list[StoredBlob]:
        """Store a batch of small files into shared packs of its own (read whole, one write each)."""
        shared: PackWriter | None = None
        stored = []
        for entry in entries:
            fd = open_for_read(os.path.join(root, entry.path))
            try:
                data = read_small_content(fd, entry)
                _check_unchanged(fd, entry)
            finally:
                os.close(fd)
            digest = hashlib.sha256(data).hexdigest()
            location = self._known(digest)
            if location is None:
                if shared is None:
                    shared = self._open_pack()
                shared.write(data)
                location = shared.end_blob(digest)
                with self._lock:
                    self._pending[digest] = location
                    self.new_bytes += len(data)
            self._advance(len(data))
            stored.append(location)
        if shared is not None:
            self._fill(shared)
        return stored

    def store_large(self, path: str, entry: ScannedEntry, buffer: mmap.mmap) -> StoredBlob:
        pack = self._open_pack(size_hint=stored_length(entry))
        try:
            fd = open_for_read(path)
            try:
                digest = hashlib.sha256()
                for chunk in iter_stored_content_into(fd, entry, buffer):
                    digest.update(chunk)
                    pack.write(chunk)
                    self._advance(len(chunk))
                _check_unchanged(fd, entry)
            finally:
                os.close(fd)
            hexdigest = digest.hexdigest()
            known = self._known(hexdigest)
            if known is not None:
                self._discard(pack)
                return known
            location = pack.end_blob(hexdigest)
        except BaseException:
            self._discard(pack)
            raise
        with self._lock:
            self.new_bytes += location.length
            location = self._pending.setdefault(hexdigest, location)
        self._fill(pack)
        return location

    def _open_pack(self, *, size_hint: int | None = None) -> PackWriter:
        pack = PackWriter(self._objects, self._index.tenant_id, size_hint=size_hint)
        with self._lock:
            self._open_packs.add(pack)
        return pack

    def _discard(self, pack: PackWriter) -> None:
        with self._lock:
            self._open_packs.discard(pack)
        pack.abort()

    def _fill(self, pack: PackWriter) -> None:
        """`pack` takes no more blobs: leave it for `commits()`, committing the oldest filled
        pack now if too many wait."""
        with self._lock:
            self._filled.append(pack)
            oldest = self._filled.pop(0) if len(self._filled) > _MAX_FILLED_PACKS else None
        if oldest is not None:
            self._commit(oldest)

    def commits(self) -> list[Callable[[], None]]:
        """One task per filled pack not committed yet: commit it. Call once every content
        task is done (every pack still open is filled then)."""
        with self._lock:
            filled, self._filled = self._filled, []
        return [functools.partial(self._commit, pack) for pack in filled]

    def _commit(self, pack: PackWriter) -> None:
        index = pack.commit()
        with self._lock:
            self._open_packs.discard(pack)
            self.packs.append(index)

    def publish(self) -> None:
        """Make the committed packs' blobs known to the tenant's later persists.

        Only once committed, so no concurrent persist can come to depend on bytes that might
        still be aborted.
        """
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
    locations: dict[str, StoredBlob] = {}
    to_store: list[ScannedEntry] = []
    stored_already: list[ScannedEntry] = []  # content the tenant has, or no content at all
    for entry in scan.entries:
        known = index.get(entry.digest) if entry.kind == "file" and entry.digest is not None else None
        if known is not None:
            locations[entry.path] = known
        if entry.kind == "file" and stored_length(entry) > 0 and known is None:
            to_store.append(entry)
        else:
            stored_already.append(entry)
    storer = _Storer(objects, index, sum(stored_length(entry) for entry in to_store), request.progress)
    snapshot_id = new_snapshot_id()
    opened_tree: list[ObjectWriter] = []

    def open_tree() -> None:
        # Opening the tree creates (and fsyncs) the session's directories when they are new:
        # I/O waits that overlap with the hashing as a task instead of adding to the end.
        opened_tree.append(objects.open_writer(layout.tree_key(scope, snapshot_id)))

    written: list[_WrittenTree] = []
    listed: list[str | None] = []
    encoded = _EncodedEntries()
    already_located = dict(locations)  # the tasks add to `locations` meanwhile

    def open_tree_and_encode_the_rest() -> None:
        open_tree()
        encoded.add(stored_already, already_located)

    def write_tree() -> None:
        written.append(_write_tree(opened_tree[0], scan, encoded, request.manifest_digest))

    def list_tree() -> None:
        listed.append(scan.stat_listing())

    try:
        _store_content(executor, storer, str(request.workspace), to_store, locations, encoded, open_tree_and_encode_the_rest)
        # Every pack's fsync and the tree's (after joining its lines and hashing the fingerprint)
        # wait on the disk at the same time; the header below must wait for all of them.
        run_calls(executor, [write_tree, *storer.commits()])
        storer.publish()
    except BaseException:
        storer.abort()
        for writer in opened_tree:
            writer.abort()
        raise
    tree = written[0]
    info = SnapshotInfo(
        snapshot_id=snapshot_id,
        tenant_id=scope.tenant_id,
        session_id=scope.session_id,
        created_at=datetime.now(UTC),
        parent_id=request.parent_id,
        fingerprint=tree.fingerprint,
        fingerprint_version=FINGERPRINT_VERSION,
        manifest_digest=request.manifest_digest,
        tree_sha256=tree.sha256,
        tree_bytes=tree.size,
        root=scan.root,
        entry_count=len(scan.entries),
        file_count=tree.file_count,
        total_bytes=tree.total_bytes,
        new_bytes=storer.new_bytes,
        packs=tuple(sorted({location.pack for location in locations.values()})),
    )
    header = info.model_dump_json(indent=1).encode()

    def write_header() -> None:
        objects.put_bytes(layout.header_key(scope, snapshot_id), header)

    # The stat listing (CPU only) is computed while the header's fsync waits: run beside the
    # tree's encoding, it would hold the GIL that encoding needs.
    run_calls(executor, [write_header, list_tree])
    return PersistResult(
        snapshot=info,
        stat_cache=scan.stat_cache(),  # every entry's digest is that of its stored blob by now
        skipped=tuple(scan.skipped),
        stat_listing=listed[0],
    )


def _store_content(
    executor: Executor,
    storer: _Storer,
    root: str,
    to_store: list[ScannedEntry],
    locations: dict[str, StoredBlob],
    encoded: _EncodedEntries,
    open_tree: Callable[[], None],
) -> None:
    """Hash and copy every file in `to_store` into packs, recording where each one went and
    encoding its tree line and fingerprint row."""
    large = sorted(
        (entry for entry in to_store if stored_length(entry) > SMALL_FILE_LIMIT), key=lambda entry: -stored_length(entry)
    )
    # Largest first: they are most of the bytes the disk has to absorb, so its work starts
    # early; the batches of small files fill the threads in after them.
    tasks: list[Callable[[], None] | ScannedEntry | list[ScannedEntry]] = [open_tree, *large]
    batch: list[ScannedEntry] = []
    batch_bytes = 0
    for entry in to_store:
        if stored_length(entry) <= SMALL_FILE_LIMIT:
            batch.append(entry)
            batch_bytes += stored_length(entry)
            if batch_bytes >= _SMALL_BATCH_BYTES:
                tasks.append(batch)
                batch, batch_bytes = [], 0
    if batch:
        tasks.append(batch)
    locations_lock = threading.Lock()

    def store(task: Callable[[], None] | ScannedEntry | list[ScannedEntry], buffer: mmap.mmap) -> None:
        if isinstance(task, list):
            entries, stored = task, dict(zip((e.path for e in task), storer.store_small_batch(root, task), strict=True))
        elif isinstance(task, ScannedEntry):
            entries, stored = [task], {task.path: storer.store_large(os.path.join(root, task.path), task, buffer)}
        else:
            task()
            return
        encoded.add(entries, stored)
        with locations_lock:
            locations.update(stored)

    # Aligned, so that a large file's chunks can go from it to the disk directly (`_direct_io`).
    run_tasks(executor, tasks, store, lambda _lane: aligned_buffer(_COPY_CHUNK))


@dataclass(frozen=True, slots=True)
class _WrittenTree:
    sha256: str
    size: int
    fingerprint: str
    file_count: int
    total_bytes: int


def _write_tree(tree: ObjectWriter, scan: WorkspaceScan, encoded: _EncodedEntries, manifest_digest: str) -> _WrittenTree:
    """Write and commit the tree; the fingerprint is computed from the same entries."""
    digest = hashlib.sha256()
    lines = encoded.lines(scan.entries)
    for start in range(0, len(lines), 1024):
        _write_lines(tree, digest, lines[start : start + 1024])
    files = [entry for entry in scan.entries if entry.kind == "file"]
    fingerprint = fingerprint_of_rows(encoded.rows(scan.entries), scan.root, manifest_digest)  # CPU before the fsync
    tree.commit()
    return _WrittenTree(
        sha256=digest.hexdigest(),
        size=tree.size,
        fingerprint=fingerprint,
        file_count=len(files),
        total_bytes=sum(entry.size for entry in files),
    )


def _write_lines(tree: ObjectWriter, digest: Any, lines: list[bytes]) -> None:
    data = b"".join(lines)
    digest.update(data)
    tree.write(data)
