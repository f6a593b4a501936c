"""`ObjectStore` on a local directory: the default snapshot backend of a one-machine deployment.

Each key is a file under `root`; a writer fills a hidden temporary sibling, fsyncs it, renames
it into place and fsyncs the directory, so a `kill -9` or a power cut leaves either the old
state or the whole new object (design invariant 7). Temporary files are never listed, and
`sweep_abandoned` removes those a killed writer left behind.

A big object is made durable in steps while it is written (`_DurableAhead`), so that the disk
does most of the work of the commit's fsync while the persist is still hashing.
"""

from __future__ import annotations

import errno
import io
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NoReturn

from cairn.snapshots._fsutil import TEMP_MARKER, fsync_dir, make_dirs_durable, start_writeback, temp_name_for
from cairn.snapshots.errors import ObjectMissingError, SnapshotStoreUnavailableError
from cairn.snapshots.objects import ObjectInfo, ObjectReader, ObjectStore, ObjectWriter

__all__ = ["LocalObjectStore"]


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


class _LocalWriter(ObjectWriter):
    def __init__(self, path: Path, key: str) -> None:
        super().__init__()
        self._path = path
        self._key = key
        self._written_back = 0
        self._temp = temp_name_for(path)
        try:
            make_dirs_durable(path.parent)
            self._handle: BinaryIO = open(self._temp, "xb", buffering=_BUFFER)
        except OSError as error:
            _raise_unavailable("create", key, error)
        self._durable_ahead = _DurableAhead(self._handle.fileno())

    def _write(self, data: bytes | memoryview) -> None:
        try:
            self._handle.write(data)
            end = self.size + len(data)
            if end - self._written_back >= _WRITEBACK_STEP:
                self._handle.flush()
                start_writeback(self._handle.fileno(), self._written_back, end - self._written_back)
                if end // _DURABLE_STEP != self._written_back // _DURABLE_STEP:
                    self._durable_ahead.request()
                self._written_back = end
        except OSError as error:
            self._abort()
            _raise_unavailable("write", self._key, error)

    def _commit(self) -> None:
        try:
            self._handle.flush()
            self._durable_ahead.wait()
            os.fsync(self._handle.fileno())
            self._handle.close()
            os.replace(self._temp, self._path)
            fsync_dir(self._path.parent)
        except OSError as error:
            self._abort()
            _raise_unavailable("commit", self._key, error)

    def _abort(self) -> None:
        try:
            self._durable_ahead.wait()
        except OSError:
            pass  # the object is being thrown away; its flush error no longer matters
        self._handle.close()
        self._temp.unlink(missing_ok=True)


class _RangeReader:
    """Reads at most `remaining` bytes of an open file; `remaining < 0` means to the end."""

    def __init__(self, handle: io.BufferedReader, remaining: int) -> None:
        self._handle = handle
        self._remaining = remaining

    def read(self, size: int = -1, /) -> bytes:
        if self._remaining < 0:
            return self._handle.read(size)
        if size < 0 or size > self._remaining:
            size = self._remaining
        data = self._handle.read(size)
        self._remaining -= len(data)
        return data

    def readinto(self, buffer: memoryview, /) -> int:
        """Like `read(len(buffer))` into a caller's buffer, so big copies reuse one allocation."""
        if 0 <= self._remaining < len(buffer):
            buffer = buffer[: self._remaining]
        count = self._handle.readinto(buffer)
        if self._remaining >= 0:
            self._remaining -= count
        return count

    def close(self) -> None:
        self._handle.close()


class LocalObjectStore(ObjectStore):
    name = "local"

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def open_writer(self, key: str) -> ObjectWriter:
        return _LocalWriter(self._path(key), key)

    def open_reader(self, key: str, offset: int = 0, length: int | None = None) -> ObjectReader:
        try:
            handle = open(self._path(key), "rb")
        except FileNotFoundError as error:
            raise ObjectMissingError(
                f"snapshot store: object {key!r} is missing", context={"key": key}
            ) from error
        except OSError as error:
            _raise_unavailable("open", key, error)
        try:
            handle.seek(offset)
        except OSError as error:
            handle.close()
            _raise_unavailable("seek in", key, error)
        return _RangeReader(handle, -1 if length is None else length)

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
