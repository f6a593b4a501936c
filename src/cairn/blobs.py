"""Content-addressed blob storage on the local disk (artifact bytes).

A blob is named by the SHA-256 of its content and written once (temp file, fsync,
rename), so the same content published twice is stored once and never changes.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from cairn.errors import WorkspaceError

__all__ = ["BlobStore"]

_CHUNK = 1024 * 1024


class BlobStore:
    """Blocking calls: run them through `cairn._concurrency.run_sync`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_of(self, sha256: str) -> Path:
        if len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256):
            raise WorkspaceError(f"not a sha256 digest: {sha256!r}")
        return self.root / sha256[:2] / sha256[2:]

    def put_stream(self, source: BinaryIO) -> tuple[str, int]:
        """Store everything readable from `source`; return (sha256, size)."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".incoming-")
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            final = self.path_of(digest.hexdigest())
            final.parent.mkdir(exist_ok=True)
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest.hexdigest(), size

    def iter_chunks(self, sha256: str) -> Iterator[bytes]:
        with self.path_of(sha256).open("rb") as f:
            while chunk := f.read(_CHUNK):
                yield chunk
