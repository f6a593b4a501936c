"""Durable file primitives: fsync a directory, create directories durably, write atomically.

Design invariant 7 needs "temp + rename" to survive a machine crash as well as a killed
process, which means fsyncing the file before the rename and its directory after it.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import secrets
import struct
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "atomic_write_bytes",
    "fsync_dir",
    "make_dirs_durable",
    "spread_subdirectories",
    "start_writeback",
    "temp_name_for",
]

TEMP_MARKER = ".tmp-"


def temp_name_for(path: Path) -> Path:
    """A hidden sibling of `path`; names containing `TEMP_MARKER` are never listed as objects."""
    return path.with_name(f".{path.name}{TEMP_MARKER}{secrets.token_hex(6)}")


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if sys.platform != "linux":
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing a range of a file to disk now, without waiting for it.

    Not a durability guarantee (the fsync at commit still is one): it lets the disk work while
    we keep hashing, so that the fsync at the end of a 50 MiB pack waits for the last few
    megabytes instead of all of them. Linux `sync_file_range(SYNC_FILE_RANGE_WRITE)`, as
    PostgreSQL's `*_flush_after` settings use it; a no-op elsewhere or if the call fails.
    """
    if _sync_file_range is not None and length > 0:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs_durable(path: Path) -> None:
    """`mkdir -p` that also fsyncs the parent of every directory it created."""
    missing: list[Path] = []
    current = path
    while not current.is_dir():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            continue  # a concurrent writer created it; it is durable once they fsync it too
        fsync_dir(directory.parent)


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace `path` with `data` so that readers see the old or the new content, never a mix."""
    make_dirs_durable(path.parent)
    temp = temp_name_for(path)
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


# linux/fs.h: FS_IOC_GETFLAGS / FS_IOC_SETFLAGS (the argument is an int despite the ioctl's
# declared `long`) and FS_TOPDIR_FL, which `chattr +T` sets.
_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
_FS_TOPDIR_FL = 0x00020000


def spread_subdirectories(directory: Path) -> None:
    """Best effort: ask ext4 to place the subdirectories of `directory` like top-level ones.

    ext4's Orlov allocator puts a subdirectory (and so its files' inodes) in its parent's block
    group, and without a journal it then skips every inode freed in the last minute or more,
    one buffer lookup each, for every file it creates: after a workspace's trash is deleted,
    creating 2,000 files there costs ~0.25 ms each instead of ~0.01 ms. A directory marked
    as the top of a hierarchy (`chattr +T`) has its subdirectories spread over groups with free
    inodes instead. Only the restore's staging directory gets the mark, and it is deleted once
    its entries are moved into the workspace. Other file systems or kernels: nothing happens.
    """
    if sys.platform != "linux" or struct.calcsize("l") != 8:
        return
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        flags = bytearray(4)
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags)
        (value,) = struct.unpack("=i", flags)
        fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("=i", value | _FS_TOPDIR_FL))
    except OSError:
        pass  # not ext2/3/4, or the flag is refused: only an allocation hint is lost
    finally:
        os.close(fd)
