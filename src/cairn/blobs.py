"""Content-addressed blob storage on the local disk (artifact bytes).

A blob is named by the SHA-256 of its content and written once (temp file, fsync,
rename), so the same content published twice is stored once and never changes.

Garbage collection (`cairn.engine.blob_gc`) relies on two properties of this layout:
- every store renames a fresh copy into place, even over an existing one, so a blob's
  mtime is the last time it was *stored*: content published again is young again;
- a sweep never unlinks a blob by name. It first moves it aside under a `.condemned-` name,
  which takes exactly the copy whose age it then checks; a store that renames a new copy
  into place at any moment is untouched by the removal of the old one. A young copy moved
  aside by mistake goes back, unless a newer copy has been stored meanwhile.
Several processes, on one machine or sharing the directory over a network file system,
may store and collect at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cairn.errors import BlobStoreError

__all__ = ["CONDEMNED_PREFIX", "INCOMING_PREFIX", "BlobFile", "BlobStore", "BlobSurvey"]

_CHUNK = 1024 * 1024
_HEX = frozenset("0123456789abcdef")
INCOMING_PREFIX = ".incoming-"
CONDEMNED_PREFIX = ".condemned-"


def _is_digest(name: str) -> bool:
    return len(name) == 64 and _HEX.issuperset(name)


@dataclass(frozen=True, slots=True)
class BlobFile:
    """A file a sweep is about to delete or settle; `sha256` is None for a temporary file."""

    name: str  # below the root: "ab/cdef…" for a blob; a temporary file's name beside them
    sha256: str | None
    size: int
    mtime: float


@dataclass(frozen=True, slots=True)
class BlobSurvey:
    """The top of the blob directory: its prefix directories and the temporary files beside them."""

    prefixes: list[str]
    incoming: list[BlobFile]  # writes in progress, or abandoned by a crash
    condemned: list[BlobFile]  # moved aside by a sweep that has not finished (or died)


class BlobStore:
    """Blocking calls: run them through `cairn._concurrency.run_sync`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_of(self, sha256: str) -> Path:
        if not _is_digest(sha256):
            raise BlobStoreError(f"not a sha256 digest: {sha256!r}")
        return self.root / sha256[:2] / sha256[2:]

    def put_stream(self, source: BinaryIO) -> tuple[str, int]:
        """Store everything readable from `source`; return (sha256, size).

        The final rename happens even when the content is already stored: it is what makes
        the blob young again for the garbage collector's grace period.
        """
        try:
            return self._put(source)
        except OSError as exc:
            raise BlobStoreError(f"artifact content could not be stored: {exc}") from exc

    def _put(self, source: BinaryIO) -> tuple[str, int]:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=INCOMING_PREFIX)
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

    # -- garbage collection primitives (see the module docstring) ---------------------------

    def clock(self) -> float:
        """Now, by the clock that stamps this directory's files.

        Blob ages are measured against it rather than this host's clock, so processes on
        machines sharing the directory over a network file system agree on them even when
        their clocks drift apart. The probe is an incoming file, removed at once.
        """
        try:
            fd, probe = tempfile.mkstemp(dir=self.root, prefix=INCOMING_PREFIX)
            try:
                return os.fstat(fd).st_mtime
            finally:
                os.close(fd)
                os.unlink(probe)
        except OSError as exc:
            raise BlobStoreError(f"the blob directory {self.root} is not writable: {exc}") from exc

    def survey(self) -> BlobSurvey | None:
        """List the top of the blob directory; None when nothing was ever stored."""
        prefixes: list[str] = []
        incoming: list[BlobFile] = []
        condemned: list[BlobFile] = []
        try:
            with os.scandir(self.root) as entries:
                for entry in entries:
                    name = entry.name
                    if len(name) == 2 and _HEX.issuperset(name):
                        if entry.is_dir(follow_symlinks=False):
                            prefixes.append(name)
                    elif name.startswith(INCOMING_PREFIX):
                        if found := _regular(entry, name, None):
                            incoming.append(found)
                    elif name.startswith(CONDEMNED_PREFIX) and _is_digest(sha256 := name[len(CONDEMNED_PREFIX) :][:64]):
                        if found := _regular(entry, name, sha256):
                            condemned.append(found)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise BlobStoreError(f"the blob directory {self.root} could not be listed: {exc}") from exc
        return BlobSurvey(sorted(prefixes), incoming, condemned)

    def scan_prefix(self, prefix: str, cutoff: float) -> tuple[int, dict[str, int]]:
        """How many blobs one prefix directory holds, and the size of each last stored before
        `cutoff`; files not named like a blob are left alone.

        Digests and sizes only, on purpose: a sweep of millions of blobs keeps no object per
        blob for Python's cyclic garbage collector to walk. With one object per blob, its full
        collections came often enough during a sweep to pause the event loop for 80-100 ms.
        """
        count, old = 0, {}
        try:
            with os.scandir(self.root / prefix) as entries:
                for entry in entries:
                    sha256 = prefix + entry.name
                    if _is_digest(sha256) and (found := _regular(entry, entry.name, sha256)):
                        count += 1
                        if found.mtime < cutoff:
                            old[sha256] = found.size
        except FileNotFoundError:
            return 0, {}
        except OSError as exc:
            raise BlobStoreError(f"the blob directory {self.root / prefix} could not be listed: {exc}") from exc
        return count, old

    def condemn(self, sha256: str, cutoff: float) -> BlobFile | None:
        """Move a blob aside to be deleted, if it was last stored before `cutoff`.

        Returns the moved-aside copy, or None when there is nothing to delete: the blob is
        gone, or it is young (then it is put back, see `settle`). Call it only while
        holding the sweep lock, after checking that no artifact references the blob.
        """
        aside = f"{CONDEMNED_PREFIX}{sha256}.{secrets.token_hex(6)}"
        try:
            os.rename(self.path_of(sha256), self.root / aside)
        except FileNotFoundError:
            return None  # another sweep took it first
        except OSError as exc:
            raise BlobStoreError(f"blob {sha256} could not be moved aside: {exc}") from exc
        return self.settle(BlobFile(aside, sha256, 0, 0.0), cutoff)

    def settle(self, condemned: BlobFile, cutoff: float) -> BlobFile | None:
        """Decide a moved-aside copy: stored since `cutoff`, it goes back under its name (a
        publish may be about to reference it) and None is returned; older, it is returned for
        `delete`. Also settles what a sweep that died left behind."""
        assert condemned.sha256 is not None
        aside = self.root / condemned.name
        try:
            st = os.lstat(aside)
            if st.st_mtime < cutoff:
                return BlobFile(condemned.name, condemned.sha256, st.st_size, st.st_mtime)
            target = self.path_of(condemned.sha256)
            target.parent.mkdir(exist_ok=True)
            _link_unless_present(aside, target)
            os.unlink(aside)
        except FileNotFoundError:
            return None  # another sweep settled it
        except OSError as exc:
            raise BlobStoreError(f"blob {condemned.sha256} could not be put back: {exc}") from exc
        return None

    def delete(self, doomed: BlobFile) -> bool:
        """Unlink a moved-aside copy or an abandoned temporary file; False if already gone."""
        try:
            os.unlink(self.root / doomed.name)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise BlobStoreError(f"{self.root / doomed.name} could not be deleted: {exc}") from exc
        return True


def _regular(entry: os.DirEntry[str], name: str, sha256: str | None) -> BlobFile | None:
    try:
        st = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None  # removed since it was listed
    if not stat.S_ISREG(st.st_mode):
        return None
    return BlobFile(name, sha256, st.st_size, st.st_mtime)


def _link_unless_present(source: Path, target: Path) -> None:
    """Give `source` the name `target`, unless `target` exists: then a publish stored the same
    content again meanwhile, and that copy is the newer one."""
    with contextlib.suppress(FileExistsError):
        os.link(source, target)
