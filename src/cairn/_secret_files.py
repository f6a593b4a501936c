"""Files that hold keys in the data dir: created once by whichever process gets there first,
replaced whole, readable by their owner only (mode 0600).

A new file is written aside, synced, and linked into place: `link` fails when the name exists,
so two processes creating the same key file at once agree on one content, and a reader never
sees a half-written file. A replacement is written aside and renamed over the old file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

__all__ = ["create_once", "replace_whole"]


def _write_aside(path: Path, content: str) -> Path:
    aside = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    return aside


def create_once(path: Path, content: str) -> str:
    """The file's content, after creating it with `content` if it did not exist."""
    if not path.exists():
        aside = _write_aside(path, content)
        try:
            with contextlib.suppress(FileExistsError):  # another process made it first: its content stands
                os.link(aside, path)
        finally:
            os.unlink(aside)
    return path.read_text()


def replace_whole(path: Path, content: str) -> None:
    """Replace the file's content at once: a reader sees the old file or the new one."""
    aside = _write_aside(path, content)
    try:
        os.replace(aside, path)
    except OSError:
        os.unlink(aside)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
