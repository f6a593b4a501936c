"""Direct I/O for large snapshot content: between our buffers and the disk, not through the page cache.

Why: a pack of a large file is written once and read rarely, so the page cache only loses by
holding it. A buffered write of 150 MiB allocates 150 MiB of page cache, evicting the hot pages
of live workspaces, and allocating it can cost more than the write itself: on a VM whose host
takes back free guest memory (virtio-balloon free page reporting, as on the machines we measure
on), every newly touched page faults into the host. Measured there (docs/snapshots.md, "Direct
I/O"): `dd` of 159 MiB with `conv=fdatasync` took 0.44-0.65 s in such rounds and 0.10 s
otherwise; with `oflag=direct`, 0.11-0.12 s in both.

Linux requires the buffer address, the file offset and the length of an O_DIRECT transfer to be
multiples of the device's logical block size. `ALIGNMENT` (4 KiB) covers 512-byte and 4 KiB
devices; a file system that still refuses gets buffered I/O, with a warning (`open_direct_best_effort`).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import mmap
import os

__all__ = ["ALIGNMENT", "aligned_buffer", "is_aligned", "open_direct_best_effort", "stop_direct"]

logger = logging.getLogger(__name__)

ALIGNMENT = 4096
_O_DIRECT: int = getattr(os, "O_DIRECT", 0)


def aligned_buffer(size: int) -> mmap.mmap:
    """A writable buffer of `size` bytes at a page-aligned address (an anonymous mapping)."""
    return mmap.mmap(-1, size)


def is_aligned(view: memoryview) -> bool:
    """Whether `view` starts at an `ALIGNMENT`-aligned address; read-only views count as not aligned."""
    try:
        address = ctypes.addressof(ctypes.c_char.from_buffer(view))
    except TypeError:
        return False  # a read-only buffer (bytes): it is copied into an aligned one instead
    return address % ALIGNMENT == 0


def open_direct_best_effort(path: str, flags: int, mode: int = 0o666) -> tuple[int, bool]:
    """Open `path` with O_DIRECT if its file system supports it: (fd, whether direct).

    Falls back to a plain open, logging a WARNING, when the platform has no O_DIRECT or the
    file system refuses it (EINVAL: tmpfs before Linux 6.6, some FUSE and network file systems).
    """
    if _O_DIRECT:
        try:
            return os.open(path, flags | _O_DIRECT, mode), True
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            logger.warning("snapshot store: %s refuses direct I/O (%s); using the page cache", path, error)
    return os.open(path, flags, mode), False


def stop_direct(fd: int) -> None:
    """Switch an open file from direct to buffered I/O (for an unaligned transfer, or after EINVAL)."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_DIRECT)
