"""Durable file primitives: fsync a directory, create directories durably, write atomically.

Design invariant 7 needs "temp + rename" to survive a machine crash as well as a killed
process, which means fsyncing the file before the rename and its directory after it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["atomic_write_bytes", "fsync_dir", "make_dirs_durable", "temp_name_for"]

TEMP_MARKER = ".tmp-"


def temp_name_for(path: Path) -> Path:
    """A hidden sibling of `path`; names containing `TEMP_MARKER` are never listed as objects."""
    return path.with_name(f".{path.name}{TEMP_MARKER}{secrets.token_hex(6)}")


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
