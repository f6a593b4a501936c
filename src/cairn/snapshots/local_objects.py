"""`ObjectStore` on a local directory: the default snapshot backend of a one-machine deployment.

Each key is a file under `root`; a writer fills a hidden temporary sibling, fsyncs it, renames
it into place and fsyncs the directory, so a `kill -9` or a power cut leaves either the old
state or the whole new object (design invariant 7). Temporary files are never listed, and
`sweep_abandoned` removes those a killed writer left behind.

An object announced as large (a pack of one large file) is written with direct I/O, around
the page cache (`_DirectWriter`, `_direct_io`), and a long range is read without staying cached
(`_RangeReader`, dropping behind). Other objects go through the page cache and are made durable in
steps while they are written (`_DurableAhead`), so that the disk does most of the work of the
commit's fsync while the persist is still hashing.
"""

from __future__ import annotations

import abc
import errno
import logging
import mmap
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NoReturn

from cairn.snapshots._direct_io import ALIGNMENT, aligned_buffer, is_aligned, open_direct_best_effort, stop_direct
from cairn.snapshots._fsutil import TEMP_MARKER, fsync_dir, make_dirs_durable, start_writeback, temp_name_for
from cairn.snapshots.errors import ObjectMissingError, SnapshotStoreUnavailableError
from cairn.snapshots.objects import ObjectInfo, ObjectReader, ObjectStore, ObjectWriter

__all__ = ["LocalObjectStore"]

logger = logging.getLogger(__name__)


def _raise_unavailable(action: str, key: str, error: OSError) -> NoReturn:
    retryable = error.errno not in {errno.EACCES, errno.EPERM, errno.EROFS}
    raise SnapshotStoreUnavailableError(
        f"snapshot store: cannot {action} {key!r}: {error.strerror or error}",
        retryable=retryable,
        context={"key": key},
    ) from error


# Start writing a pack to disk every this many bytes (see `start_writeback`).
_WRITEBACK_STEP = 8 * 1024 * 1024
# ... and ask for everything written so far to be made durable every this many bytes.
_DURABLE_STEP = 16 * 1024 * 1024
# A pack of small files receives one write per file: buffer them into few system calls
# (chunks of a large file are bigger than this and go to the kernel directly).
_BUFFER = 256 * 1024
# Objects announced at least this large are written with direct I/O (`_direct_io`), and ranges
# at least this long are read without keeping them cached (`_RangeReader`). Smaller ones
# are not worth a device round trip per write.
DIRECT_IO_MIN = 4 * 1024 * 1024
# A long-range reader drops what it has read from the page cache every this many bytes.
_DROP_STEP = 1024 * 1024
# A direct writer gathers unaligned writes (a file's last bytes, a pack's index) here.
_STAGE = 256 * 1024


class _DurableAhead:
    """`fdatasync` of a file being written, on a helper thread, at most one at a time.

    Why: the commit's fsync is what a persist waits for at the end, and its cost grows with
    the data the disk has accepted but not yet made durable (the device's write cache; on a
    VM, the host's page cache behind the virtual disk: measured there, the fsync of a 50 MiB
    pack waited 200-300 ms after `sync_file_range` had already sent every byte). Flushing
    each `_DURABLE_STEP` while the writer goes on lets that work overlap with hashing.

    Only a head start: durability still comes from the commit's own fsync. But an error the
    helper's flush saw is consumed by it (the kernel reports a writeback error once per open
    file), so `wait()` re-raises it and the commit fails instead of renaming a damaged file.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._thread: threading.Thread | None = None
        self._error: OSError | None = None

    def request(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return  # the running flush covers most of it; the next step asks again
        self._thread = threading.Thread(target=self._flush, name="cairn-snapshots-flush")
        self._thread.start()

    def _flush(self) -> None:
        try:
            os.fdatasync(self._fd)
        except OSError as error:
            self._error = self._error or error

    def wait(self) -> None:
        """Wait for a running flush (the file must not be closed under it); raise what it hit."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error


class _TempFileWriter(ObjectWriter):
    """Fills a hidden temporary sibling of the object's file; commit fsyncs it, renames it into
    place and fsyncs the directory (invariant 7). Subclasses decide how bytes reach the file."""

    def __init__(self, path: Path, key: str) -> None:
        super().__init__()
        self._path = path
        self._key = key
        self._temp = temp_name_for(path)
        try:
            make_dirs_durable(path.parent)
            self._fd = self._create(str(self._temp))
        except OSError as error:
            _raise_unavailable("create", key, error)

    @abc.abstractmethod
    def _create(self, temp: str) -> int:
        """Create the temporary file; returns its descriptor."""

    @abc.abstractmethod
    def _put(self, data: bytes | memoryview) -> None:
        """Take `data`, the next bytes of the object."""

    @abc.abstractmethod
    def _finish(self) -> None:
        """Hand every byte written so far to the file, before the commit's fsync."""

    @abc.abstractmethod
    def _release(self) -> None:
        """Close the file and free buffers; safe to call twice (a failed commit aborts)."""

    def _write(self, data: bytes | memoryview) -> None:
        try:
            self._put(data)
        except OSError as error:
            self._abort()
            _raise_unavailable("write", self._key, error)

    def _commit(self) -> None:
        try:
            self._finish()
            os.fsync(self._fd)
            self._release()
            os.replace(self._temp, self._path)
            fsync_dir(self._path.parent)
        except OSError as error:
            self._abort()
            _raise_unavailable("commit", self._key, error)

    def _abort(self) -> None:
        self._release()
        self._temp.unlink(missing_ok=True)


class _LocalWriter(_TempFileWriter):
    """Writes through the page cache, starting writeback and durability early (`_DurableAhead`)."""

    def __init__(self, path: Path, key: str) -> None:
        self._written_back = 0
        super().__init__(path, key)
        self._durable_ahead = _DurableAhead(self._fd)

    def _create(self, temp: str) -> int:
        self._handle: BinaryIO = open(temp, "xb", buffering=_BUFFER)
        return self._handle.fileno()

    def _put(self, data: bytes | memoryview) -> None:
        self._handle.write(data)
        end = self.size + len(data)
        if end - self._written_back >= _WRITEBACK_STEP:
            self._handle.flush()
            start_writeback(self._fd, self._written_back, end - self._written_back)
            if end // _DURABLE_STEP != self._written_back // _DURABLE_STEP:
                self._durable_ahead.request()
            self._written_back = end

    def _finish(self) -> None:
        self._handle.flush()
        self._durable_ahead.wait()

    def _release(self) -> None:
        try:
            self._durable_ahead.wait()
        except OSError:
            pass  # only reached on abort (commit waited first): the object is thrown away
        self._handle.close()


def _refused_direct_io(fd: int, key: str, error: OSError) -> None:
    logger.warning("snapshot store: %r: direct I/O refused (%s); using the page cache", key, error.strerror)
    stop_direct(fd)


class _DirectWriter(_TempFileWriter):
    """Writes a large object with direct I/O (`_direct_io`): no page cache, no early writeback.

    A chunk that starts at an aligned address (a view of an `aligned_buffer`) goes to the disk
    from the caller's memory with no copy, all but its last `len % ALIGNMENT` bytes, as long
    as nothing is gathered yet; anything else is gathered in a small aligned stage, written
    whenever it fills. At commit the stage's last, partial block is written padded to
    `ALIGNMENT` and the file truncated to its true size, then fsynced as usual: a direct write
    is on the device when it returns, but only the fsync makes the device's write cache and
    the file's size and extents durable (invariant 7).
    """

    def __init__(self, path: Path, key: str) -> None:
        self._is_direct = False
        self._stage: mmap.mmap | None = None
        self._staged = 0
        self._offset = 0
        super().__init__(path, key)

    def _create(self, temp: str) -> int:
        fd, self._is_direct = open_direct_best_effort(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC)
        return fd

    def _put(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        if self._is_direct and self._staged == 0:
            whole = len(view) - len(view) % ALIGNMENT
            if whole and is_aligned(view):
                self._write_at_offset(view[:whole])
                view = view[whole:]
        while view:
            stage = self._stage if self._stage is not None else self._open_stage()
            count = min(len(view), _STAGE - self._staged)
            stage[self._staged : self._staged + count] = view[:count]
            self._staged += count
            view = view[count:]
            if self._staged == _STAGE:
                self._write_stage(_STAGE)

    def _open_stage(self) -> mmap.mmap:
        self._stage = aligned_buffer(_STAGE)
        return self._stage

    def _write_stage(self, length: int) -> None:
        assert self._stage is not None
        with memoryview(self._stage) as stage:
            self._write_at_offset(stage[:length])
        self._staged = 0

    def _write_at_offset(self, view: memoryview) -> None:
        while view:
            try:
                written = os.pwrite(self._fd, view, self._offset)
            except OSError as error:
                if not (self._is_direct and error.errno == errno.EINVAL):
                    raise
                _refused_direct_io(self._fd, self._key, error)
                self._is_direct = False
                continue
            self._offset += written
            view = view[written:]

    def _finish(self) -> None:
        if not self._staged:
            return
        end = self._offset + self._staged
        padded = -(-self._staged // ALIGNMENT) * ALIGNMENT if self._is_direct else self._staged
        assert self._stage is not None
        self._stage[self._staged : padded] = bytes(padded - self._staged)
        self._write_stage(padded)
        if self._offset != end:
            os.ftruncate(self._fd, end)

    def _release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._stage is not None:
            self._stage.close()
            self._stage = None


class _RangeReader:
    """Reads `remaining` bytes of an open file from `position`, with positioned reads.

    A long range (`drop_behind`) is how a restore reads a pack: once. The kernel's readahead
    still fetches ahead of it (hinted sequential at open), and every page read is dropped behind
    it (`POSIX_FADV_DONTNEED`): caching the pack would only evict live workspaces' pages, and
    recycling pages instead of holding the whole range keeps the read clear of the
    newly-touched-page cost described in `_direct_io`.
    """

    def __init__(self, fd: int, position: int, remaining: int, *, drop_behind: bool) -> None:
        self._fd = fd
        self._position = self._dropped = position
        self._remaining = remaining
        self._drop_behind = drop_behind

    def readinto(self, buffer: memoryview, /) -> int:
        """Like `read(len(buffer))` into a caller's buffer, so big copies reuse one allocation."""
        count = os.preadv(self._fd, [buffer[: min(len(buffer), self._remaining)]], self._position)
        self._advance(count)
        return count

    def read(self, size: int = -1, /) -> bytes:
        want = self._remaining if size < 0 else min(size, self._remaining)
        parts: list[bytes] = []
        while want > 0 and (part := os.pread(self._fd, want, self._position)):
            parts.append(part)
            want -= len(part)
            self._advance(len(part))
        return b"".join(parts)

    def _advance(self, count: int) -> None:
        self._position += count
        self._remaining -= count
        if self._drop_behind and (self._position - self._dropped >= _DROP_STEP or self._remaining <= 0):
            os.posix_fadvise(self._fd, self._dropped, self._position - self._dropped, os.POSIX_FADV_DONTNEED)
            self._dropped = self._position

    def close(self) -> None:
        os.close(self._fd)


class LocalObjectStore(ObjectStore):
    name = "local"

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def open_writer(self, key: str, *, size_hint: int | None = None) -> ObjectWriter:
        if size_hint is not None and size_hint >= DIRECT_IO_MIN:
            return _DirectWriter(self._path(key), key)
        return _LocalWriter(self._path(key), key)

    def open_reader(self, key: str, offset: int = 0, length: int | None = None) -> ObjectReader:
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as error:
            raise ObjectMissingError(
                f"snapshot store: object {key!r} is missing", context={"key": key}
            ) from error
        except OSError as error:
            _raise_unavailable("open", key, error)
        drop_behind = length is not None and length >= DIRECT_IO_MIN
        try:
            if offset < 0:
                raise OSError(errno.EINVAL, f"negative offset {offset}")
            remaining = max(os.fstat(fd).st_size - offset, 0) if length is None else length
            if drop_behind:
                os.posix_fadvise(fd, offset, remaining, os.POSIX_FADV_SEQUENTIAL)  # a larger readahead window
        except OSError as error:
            os.close(fd)
            _raise_unavailable("seek in", key, error)
        return _RangeReader(fd, offset, remaining, drop_behind=drop_behind)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        directory = self._path(prefix.rstrip("/"))
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            return
        except OSError as error:
            _raise_unavailable("list", prefix, error)
        for entry in sorted(entries, key=lambda item: item.name):
            if TEMP_MARKER in entry.name:
                continue
            key = f"{prefix}{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                yield from self.list(f"{key}/")
            else:
                try:
                    stat = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # deleted by a concurrent garbage collection
                yield ObjectInfo(key=key, size=stat.st_size, modified_at=stat.st_mtime)

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as error:
            _raise_unavailable("delete", key, error)

    def sweep_abandoned(self, older_than_s: float) -> int:
        cutoff = time.time() - older_than_s
        removed = 0
        for directory, _subdirs, files in os.walk(self.root):
            for name in files:
                if TEMP_MARKER not in name:
                    continue
                path = Path(directory, name)
                try:
                    if path.stat().st_mtime < cutoff:
                        path.unlink()
                        removed += 1
                except FileNotFoundError:
                    continue  # another sweeper got there first
        return removed
