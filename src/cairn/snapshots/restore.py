"""Restore: rebuild a snapshot into the workspace, or fail leaving the workspace as it was.

Design invariant 7 in three phases:
1. *verify the tree*: its sha256 and length must match the header, every path must be a
   normalized relative path whose parent is a directory entry listed before it, every
   hardlink must point at a file listed before it. Nothing has been written yet.
2. *stage*: build the whole tree in a fresh sibling directory of the workspace (same file
   system, so step 3 is renames). Every blob is hashed as it is written and compared with its
   digest; a short read, a missing pack or a wrong digest abandons the staging directory and
   raises `RestoreIncompleteError`. Files are created with O_EXCL|O_NOFOLLOW under directories
   this restore created itself, symlinks are created as links and never followed, so nothing
   is ever written outside the staging directory.
3. *swap*: move the workspace's current entries into a trash directory, except excluded paths
   (mount targets, ephemeral paths) and the directories leading to them, then move the staged
   entries in. Every rename is journaled and undone in reverse if one fails.

Ownership is restored when running as root (sandbox workspaces belong to an unprivileged
uid); otherwise files belong to the restoring user. Modes and mtimes are always restored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from cairn.errors import CairnError
from cairn.snapshots import layout
from cairn.snapshots._content import CHUNK_SIZE
from cairn.snapshots._fsutil import spread_subdirectories
from cairn.snapshots._parallel import run_tasks
from cairn.snapshots.errors import RestoreIncompleteError, SnapshotCorruptError
from cairn.snapshots.exclusions import Exclusions
from cairn.snapshots.ids import SnapshotScope
from cairn.snapshots.models import RootMeta, SnapshotInfo, TreeEntry
from cairn.snapshots.objects import ObjectReader, ObjectStore
from cairn.snapshots.stat_cache import StatCache, StatKey, stat_key

__all__ = ["read_tree", "restore_workspace"]

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]

# Blobs of one pack closer than this are fetched in one ranged read (one S3 GET).
_COALESCE_GAP = 256 * 1024
_MAX_SPAN = 64 * 1024 * 1024

STAGING_MARKER = ".cairn-restore-"
TRASH_MARKER = ".cairn-trash-"

_TREE = TypeAdapter(list[TreeEntry])


def read_tree(objects: ObjectStore, info: SnapshotInfo) -> list[TreeEntry]:
    """The verified entries of a snapshot; raises `SnapshotCorruptError` on any mismatch."""
    scope = SnapshotScope(info.tenant_id, info.session_id)
    key = layout.tree_key(scope, info.snapshot_id)
    reader = objects.open_reader(key)
    digest = hashlib.sha256()
    raw = bytearray()
    try:
        while chunk := reader.read(CHUNK_SIZE):
            digest.update(chunk)
            raw += chunk
    finally:
        reader.close()
    if len(raw) != info.tree_bytes or digest.hexdigest() != info.tree_sha256:
        raise SnapshotCorruptError(
            f"snapshot {info.snapshot_id}: tree is truncated or altered "
            f"({len(raw)} of {info.tree_bytes} bytes, digest mismatch)",
            context={"key": key},
        )
    try:
        # One validation call for the whole list: per-line model_validate costs ~10 µs an entry.
        entries = _TREE.validate_python([json.loads(line) for line in raw.splitlines()])
    except (ValueError, ValidationError) as error:
        raise SnapshotCorruptError(f"snapshot {info.snapshot_id}: tree is unreadable", context={"key": key}) from error
    _validate_tree(entries, info.snapshot_id)
    return entries


def _validate_tree(entries: list[TreeEntry], snapshot_id: str) -> None:
    directories: set[str] = {""}
    files: set[str] = set()
    seen: set[str] = set()
    for entry in entries:
        parts = entry.path.split("/")
        parent = "/".join(parts[:-1])
        problem = None
        if any(part in {"", ".", ".."} for part in parts) or "\0" in entry.path:
            problem = "is not a normalized relative path"
        elif entry.path in seen:
            problem = "appears twice"
        elif parent not in directories:
            problem = "has no directory entry for its parent before it"
        elif entry.kind == "hardlink" and entry.target not in files:
            problem = "is a hardlink to a file that is not listed before it"
        elif entry.kind == "symlink" and not entry.target:
            problem = "is a symlink without a target"
        elif entry.kind == "file" and entry.size > 0 and entry.blob is None and entry.extents != ():
            problem = "is a non-empty file without content"
        if problem is not None:
            raise SnapshotCorruptError(f"snapshot {snapshot_id}: entry {entry.path!r} {problem}")
        seen.add(entry.path)
        if entry.kind == "dir":
            directories.add(entry.path)
        elif entry.kind == "file":
            files.add(entry.path)


def restore_workspace(
    objects: ObjectStore,
    executor: Executor,
    info: SnapshotInfo,
    workspace: Path,
    exclusions: Exclusions,
    progress: Progress | None = None,
) -> StatCache:
    """Make `workspace` hold exactly snapshot `info` (plus excluded paths); returns its stat cache."""
    try:
        entries = [entry for entry in read_tree(objects, info) if not exclusions.is_excluded(entry.path)]
    except CairnError as error:
        raise RestoreIncompleteError(
            f"restore incomplete: snapshot {info.snapshot_id} cannot be read ({error}); "
            "the workspace was not touched",
            context={"snapshot_id": info.snapshot_id},
        ) from error
    staging = workspace.parent / f".{workspace.name}{STAGING_MARKER}{secrets.token_hex(6)}"
    try:
        workspace.mkdir(parents=True, exist_ok=True)
        if workspace.is_symlink():
            raise NotADirectoryError(f"{workspace} is a symlink; workspaces are never followed")
        _check_same_device(workspace)
        _remove_leftovers_best_effort(workspace)
        staging.mkdir(mode=0o700)
        spread_subdirectories(staging)
    except OSError as error:
        raise RestoreIncompleteError(
            f"restore incomplete: cannot prepare {workspace} ({error}); the workspace was not touched",
            context={"snapshot_id": info.snapshot_id},
        ) from error
    try:
        _stage(objects, executor, info, entries, staging, progress)
    except BaseException as error:
        _remove_tree_best_effort(staging)
        if isinstance(error, Exception):
            raise RestoreIncompleteError(
                f"restore incomplete: snapshot {info.snapshot_id} could not be rebuilt ({error}); "
                "the workspace was not touched",
                context={"snapshot_id": info.snapshot_id},
            ) from error
        raise
    _swap(workspace, staging, exclusions, entries, info)
    return _stat_cache_for_best_effort(workspace, entries)


def _check_same_device(workspace: Path) -> None:
    if os.stat(workspace).st_dev != os.stat(workspace.parent).st_dev:
        raise RestoreIncompleteError(
            f"restore incomplete: {workspace} is a mount point; restores stage next to the "
            "workspace and need its parent directory on the same file system"
        )


def _remove_leftovers_best_effort(workspace: Path) -> None:
    """Delete staging/trash directories of restores that were killed half-way."""
    prefix = f".{workspace.name}"
    for sibling in workspace.parent.iterdir():
        name = sibling.name
        if name.startswith(prefix) and (STAGING_MARKER in name or TRASH_MARKER in name):
            logger.warning("removing the leftover %s of an interrupted restore", sibling)
            _remove_tree_best_effort(sibling)


def _remove_tree_best_effort(path: Path) -> None:
    def make_writable_and_retry(function: Callable[..., object], failed: str, _error: object) -> None:
        # Read-only directories (restored modes) block deleting their children as non-root.
        os.chmod(os.path.dirname(failed), stat.S_IRWXU)
        function(failed)

    try:
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=make_writable_and_retry)
        else:
            shutil.rmtree(path, onerror=make_writable_and_retry)
    except OSError as error:
        logger.warning("could not remove %s: %s; it is left for the next restore to clean", path, error)


@dataclass(slots=True)
class _Target:
    entry: TreeEntry
    fd: int


@dataclass(frozen=True, slots=True)
class _Ownership:
    """Which metadata calls a restored file still needs after `open(O_CREAT, mode)`."""

    is_root: bool
    uid: int
    gid: int
    umask: int | None

    @classmethod
    def for_staging(cls, staging: str) -> _Ownership:
        # New files get the group of a set-group-id parent instead of ours; then chown always.
        inherits_group = bool(os.stat(staging).st_mode & stat.S_ISGID)
        return cls(os.geteuid() == 0, os.geteuid(), -1 if inherits_group else os.getegid(), _read_umask())

    def needs_chown(self, entry: TreeEntry) -> bool:
        return self.is_root and (entry.uid != self.uid or entry.gid != self.gid)

    def create_mode(self, entry: TreeEntry) -> int:
        """The mode to create with: the entry's own when umask cannot alter it, else 0o600 + fchmod."""
        if self.umask is None or entry.mode & ~0o777 or entry.mode & self.umask:
            return 0o600
        return entry.mode


def _read_umask() -> int | None:
    # os.umask() can only be read by setting it, which races with other threads' file creation.
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return None


# Blobs up to this size are read, verified and written whole; bigger ones stream in chunks.
_WHOLE_BLOB = 1024 * 1024
_COPY_CHUNK = 1024 * 1024
# A many-file range of a pack is cut at a directory change once it holds this many blobs, so
# that parallel workers create files in different directories (creation in one directory
# serializes on its lock), and after _MAX_SPAN_BLOBS whatever the directories.
_SPLIT_AT_DIRECTORY = 32
_MAX_SPAN_BLOBS = 256

_Blob = tuple[int, int, str, list[TreeEntry]]
_Span = tuple[str, int, int, list[_Blob]]


def _stage(
    objects: ObjectStore,
    executor: Executor,
    info: SnapshotInfo,
    entries: list[TreeEntry],
    staging: Path,
    progress: Progress | None,
) -> None:
    base = str(staging)
    owner = _Ownership.for_staging(base)
    for entry in entries:
        if entry.kind == "dir":
            os.mkdir(os.path.join(base, entry.path), 0o700)
    by_blob: dict[tuple[str, int, int], list[TreeEntry]] = {}
    for entry in entries:
        if entry.kind != "file":
            continue
        if entry.blob is None:
            _write_empty(os.path.join(base, entry.path), entry, owner)
        else:
            by_blob.setdefault((entry.blob.pack, entry.blob.offset, entry.blob.length), []).append(entry)
    # Long copies first, one per thread, then the many-file ranges fill in around them: file
    # creation is kernel work that runs in parallel across directories, so every thread stays busy.
    spans = sorted(_spans(by_blob), key=lambda span: -(span[2] - span[1]) if len(span[3]) == 1 else 0)
    counter = _ProgressCounter(sum(length for (_pack, _offset, length) in by_blob), progress)

    def restore(span: _Span, buffer: bytearray) -> None:
        _restore_span(objects, info.tenant_id, span, base, owner, counter, buffer)

    run_tasks(executor, spans, restore, lambda _lane: bytearray(_COPY_CHUNK))
    for entry in entries:
        path = os.path.join(base, entry.path)
        if entry.kind == "hardlink" and entry.target is not None:
            os.link(os.path.join(base, entry.target), path, follow_symlinks=False)
        elif entry.kind == "symlink" and entry.target is not None:
            os.symlink(entry.target, path)
            _apply_meta(path, entry, owner.is_root, follow=False)
        elif entry.kind == "fifo":
            os.mkfifo(path, 0o600)
            _apply_meta(path, entry, owner.is_root, follow=False)
    # Children first, so a read-only directory does not stop its own restore.
    for entry in reversed(entries):
        if entry.kind == "dir":
            _apply_meta(os.path.join(base, entry.path), entry, owner.is_root, follow=False)


class _ProgressCounter:
    def __init__(self, total: int, progress: Progress | None) -> None:
        self._lock = threading.Lock()
        self._done = 0
        self._total = total
        self._progress = progress

    def advance(self, amount: int) -> None:
        if self._progress is None:
            return
        with self._lock:
            self._done += amount
            done = self._done
        self._progress(done, self._total)


def _spans(by_blob: dict[tuple[str, int, int], list[TreeEntry]]) -> Iterator[_Span]:
    """Group blobs into (pack, start, end, blobs) ranges read in one request each."""
    per_pack: dict[str, list[_Blob]] = {}
    for (pack, offset, length), targets in by_blob.items():
        digest = targets[0].digest or ""
        per_pack.setdefault(pack, []).append((offset, length, digest, targets))
    for pack, blobs in per_pack.items():
        blobs.sort(key=lambda blob: blob[0])
        current: list[_Blob] = []
        start = end = 0
        directory = ""
        for blob in blobs:
            offset, length = blob[0], blob[1]
            parent = blob[3][0].path.rpartition("/")[0]
            if current and (
                offset - end > _COALESCE_GAP
                or offset + length - start > _MAX_SPAN
                or len(current) >= _MAX_SPAN_BLOBS
                or (parent != directory and len(current) >= _SPLIT_AT_DIRECTORY)
            ):
                yield pack, start, end, current
                current = []
            if not current:
                start = offset
            current.append(blob)
            directory = parent
            end = max(end, offset + length)
        if current:
            yield pack, start, end, current


def _restore_span(
    objects: ObjectStore,
    tenant_id: str,
    span: _Span,
    base: str,
    owner: _Ownership,
    counter: _ProgressCounter,
    buffer: bytearray,
) -> None:
    pack, start, end, blobs = span
    key = layout.pack_key(tenant_id, pack)
    reader = objects.open_reader(key, start, end - start)
    try:
        position = start
        for offset, length, digest, entries in blobs:
            if offset < position:
                raise SnapshotCorruptError(f"pack {pack}: overlapping blobs at offset {offset}")
            _skip(reader, offset - position, key)
            if length <= _WHOLE_BLOB:
                _restore_whole_blob(reader, length, digest, entries, base, owner, key)
                counter.advance(length)
            else:
                targets = [_open_target(os.path.join(base, entry.path), entry, owner) for entry in entries]
                try:
                    _copy_blob(reader, length, digest, targets, key, counter, buffer)
                    for target in targets:
                        _finish_file(target.fd, target.entry, owner)
                finally:
                    for target in targets:
                        os.close(target.fd)
            position = offset + length
    finally:
        reader.close()


def _skip(reader: ObjectReader, amount: int, key: str) -> None:
    while amount > 0:
        chunk = reader.read(min(CHUNK_SIZE, amount))
        if not chunk:
            raise SnapshotCorruptError(f"object {key!r} is truncated", context={"key": key})
        amount -= len(chunk)


def _open_target(path: str, entry: TreeEntry, owner: _Ownership) -> _Target:
    return _Target(entry=entry, fd=_create(path, entry, owner))


def _create(path: str, entry: TreeEntry, owner: _Ownership) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, owner.create_mode(entry))


def _restore_whole_blob(
    reader: ObjectReader,
    length: int,
    digest: str,
    entries: list[TreeEntry],
    base: str,
    owner: _Ownership,
    key: str,
) -> None:
    """A small blob: read, verify, then create its files (nothing unverified is ever written)."""
    data = reader.read(length)
    if len(data) != length:
        raise SnapshotCorruptError(f"object {key!r} is truncated", context={"key": key})
    if hashlib.sha256(data).hexdigest() != digest:
        raise SnapshotCorruptError(
            f"content of {entries[0].path!r} does not match its digest", context={"key": key}
        )
    for entry in entries:
        fd = _create(os.path.join(base, entry.path), entry, owner)
        try:
            if entry.extents is None:
                _write_all(fd, data)
            else:
                _Extents(entry).write(fd, data)
            _finish_file(fd, entry, owner)
        finally:
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy_blob(
    reader: ObjectReader,
    length: int,
    digest: str,
    targets: list[_Target],
    key: str,
    counter: _ProgressCounter,
    buffer: bytearray,
) -> None:
    hasher = hashlib.sha256()
    extents = [_Extents(target.entry) for target in targets]
    readinto = getattr(reader, "readinto", None)
    remaining = length
    while remaining > 0:
        chunk: bytes | memoryview
        if readinto is not None:
            # Reuse one buffer: a fresh multi-megabyte bytes object per chunk costs page faults.
            view = memoryview(buffer)[: min(len(buffer), remaining)]
            chunk = view[: readinto(view)]
        else:
            chunk = reader.read(min(CHUNK_SIZE, remaining))
        if not chunk:
            raise SnapshotCorruptError(f"object {key!r} is truncated", context={"key": key})
        hasher.update(chunk)
        for target, placement in zip(targets, extents, strict=True):
            placement.write(target.fd, chunk)
        remaining -= len(chunk)
        counter.advance(len(chunk))
    if hasher.hexdigest() != digest:
        raise SnapshotCorruptError(
            f"content of {targets[0].entry.path!r} does not match its digest", context={"key": key}
        )


class _Extents:
    """Places a blob's bytes at the file offsets of its data extents (all of the file if dense)."""

    def __init__(self, entry: TreeEntry) -> None:
        self._extents = list(entry.extents) if entry.extents is not None else [(0, entry.size)]
        self._index = 0
        self._written = 0

    def write(self, fd: int, chunk: bytes | memoryview) -> None:
        view = memoryview(chunk)
        while view:
            offset, length = self._extents[self._index]
            room = length - self._written
            if room == 0:
                self._index += 1
                self._written = 0
                continue
            part = view[:room]
            written = os.pwrite(fd, part, offset + self._written)
            self._written += written
            view = view[written:]


def _write_empty(path: str, entry: TreeEntry, owner: _Ownership) -> None:
    fd = _create(path, entry, owner)
    try:
        _finish_file(fd, entry, owner)
    finally:
        os.close(fd)


def _finish_file(fd: int, entry: TreeEntry, owner: _Ownership) -> None:
    if entry.extents is not None or entry.blob is None:
        # Sparse files end in a hole (or are all hole): the size comes from truncation.
        os.ftruncate(fd, entry.size)
    if owner.needs_chown(entry):
        os.fchown(fd, entry.uid, entry.gid)
    # chmod after chown: chown clears set-id bits. Skipped when the file was created with its mode.
    if owner.create_mode(entry) != entry.mode or owner.needs_chown(entry):
        os.fchmod(fd, entry.mode)
    os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))


def _apply_meta(path: str, entry: TreeEntry | RootMeta, is_root: bool, *, follow: bool) -> None:
    is_link = isinstance(entry, TreeEntry) and entry.kind == "symlink"
    if is_root:
        os.chown(path, entry.uid, entry.gid, follow_symlinks=follow)
    if not is_link:
        os.chmod(path, entry.mode)
    os.utime(path, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=follow)


def _swap(
    workspace: Path, staging: Path, exclusions: Exclusions, entries: list[TreeEntry], info: SnapshotInfo
) -> None:
    kept = {path for path in exclusions.paths if os.path.lexists(workspace / path)}
    ancestors = {"/".join(path.split("/")[:depth]) for path in kept for depth in range(1, path.count("/") + 1)}
    trash = workspace.parent / f".{workspace.name}{TRASH_MARKER}{secrets.token_hex(6)}"
    trash.mkdir(mode=0o700)
    moves: list[tuple[str, str]] = []

    def move(source: str, destination: str) -> None:
        os.rename(source, destination)
        moves.append((source, destination))

    def clear(relative: str) -> None:
        for name in sorted(os.listdir(workspace / relative)):
            child = f"{relative}/{name}" if relative else name
            if child in kept:
                continue
            if child in ancestors and (workspace / child).is_dir() and not (workspace / child).is_symlink():
                clear(child)
                continue
            move(str(workspace / child), str(trash / str(len(moves))))

    def fill(relative: str) -> None:
        for name in sorted(os.listdir(staging / relative)):
            child = f"{relative}/{name}" if relative else name
            if child in kept:
                continue  # the live mount target wins over what the snapshot had there
            if child in ancestors:
                if (staging / child).is_dir() and not (staging / child).is_symlink():
                    fill(child)
                continue
            move(str(staging / child), str(workspace / child))

    try:
        clear("")
        fill("")
    except OSError as error:
        for source, destination in reversed(moves):
            os.rename(destination, source)
        _remove_tree_best_effort(staging)
        _remove_tree_best_effort(trash)
        raise RestoreIncompleteError(
            f"restore incomplete: moving snapshot {info.snapshot_id} into place failed ({error}); "
            "the workspace was put back as it was",
            context={"snapshot_id": info.snapshot_id},
        ) from error
    is_root = os.geteuid() == 0
    by_path = {entry.path: entry for entry in entries}
    for directory in sorted(ancestors, key=lambda path: -path.count("/")):
        entry = by_path.get(directory)
        if entry is not None and entry.kind == "dir":
            _apply_meta(str(workspace / directory), entry, is_root, follow=False)
    _apply_meta(str(workspace), info.root, is_root, follow=False)
    _remove_tree_best_effort(trash)
    _remove_tree_best_effort(staging)


def _stat_cache_for_best_effort(workspace: Path, entries: list[TreeEntry]) -> StatCache:
    """The stat cache of the files just restored; empty (next check re-hashes) if a stat fails."""
    started_ns = time.time_ns()
    base = str(workspace)
    observations: list[tuple[str, StatKey, str]] = []
    try:
        for entry in entries:
            if entry.kind == "file" and entry.blob is not None:
                key = stat_key(os.lstat(os.path.join(base, entry.path)))
                observations.append((entry.path, key, entry.blob.digest))
    except OSError as error:
        logger.warning("restored %s but could not stat it for the cache: %s", workspace, error)
        return StatCache()
    return StatCache.from_observations(observations, scan_started_ns=started_ns)
