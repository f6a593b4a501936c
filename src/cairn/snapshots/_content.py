"""Reading a workspace file's stored bytes: the whole file, or only the data extents of a sparse one.

Reads go through a file descriptor opened with O_NOFOLLOW, so a file swapped for a symlink
after the scan is refused rather than followed out of the workspace, and in fixed-size chunks,
so memory does not grow with file size.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator

from cairn.snapshots.scan import ScannedEntry

__all__ = [
    "CHUNK_SIZE",
    "hash_stored_content",
    "iter_stored_content",
    "iter_stored_content_into",
    "open_for_read",
    "read_small_content",
    "stored_length",
]

CHUNK_SIZE = 4 * 1024 * 1024


def stored_length(entry: ScannedEntry) -> int:
    """Bytes a file contributes to its blob: its size, or the sum of its data extents."""
    if entry.extents is None:
        return entry.size
    return sum(length for _offset, length in entry.extents)


def open_for_read(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)


def iter_stored_content(fd: int, entry: ScannedEntry) -> Iterator[bytes]:
    """Yield the blob bytes of `entry`, read from `fd`, exactly `stored_length(entry)` of them."""
    extents = entry.extents if entry.extents is not None else ((0, entry.size),)
    for offset, length in extents:
        position, end = offset, offset + length
        while position < end:
            chunk = os.pread(fd, min(CHUNK_SIZE, end - position), position)
            if not chunk:
                raise EOFError(f"{entry.path!r} shrank while it was being read")
            position += len(chunk)
            yield chunk


def iter_stored_content_into(fd: int, entry: ScannedEntry, buffer: mmap.mmap) -> Iterator[memoryview]:
    """Like `iter_stored_content`, but every chunk is a view of `buffer`, valid until the next one.

    Reusing one buffer avoids allocating (and page-faulting) a fresh chunk per read.
    """
    extents = entry.extents if entry.extents is not None else ((0, entry.size),)
    whole = memoryview(buffer)
    for offset, length in extents:
        position, end = offset, offset + length
        while position < end:
            count = os.preadv(fd, [whole[: min(len(buffer), end - position)]], position)
            if not count:
                raise EOFError(f"{entry.path!r} shrank while it was being read")
            position += count
            yield whole[:count]


def read_small_content(fd: int, entry: ScannedEntry) -> bytes:
    """The whole blob of a small file in one piece (dense files: usually one read call)."""
    if entry.extents is None:
        data = os.pread(fd, entry.size, 0)
        if len(data) == entry.size:
            return data
    return b"".join(iter_stored_content(fd, entry))


def hash_stored_content(path: str, entry: ScannedEntry) -> str:
    fd = open_for_read(path)
    try:
        digest = hashlib.sha256()
        for chunk in iter_stored_content(fd, entry):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)
