"""Walk a live workspace into entries, reading metadata only.

The walk uses `lstat` everywhere, so a symlink is recorded as a link and never followed (an
absolute link into a Python interpreter outside the workspace is just a link). Excluded paths
are not entered. Regular files sharing an inode become one `file` and `hardlink`s to it.
Sparse files get their data extents from SEEK_DATA/SEEK_HOLE so holes are never read.
Digests come from the stat cache when it still vouches for a file; the rest are left for
whoever needs content (persist hashes while storing, the fingerprint check hashes in place).
Sockets and device nodes cannot be restored meaningfully in a sandbox; they are skipped and
reported, never silently dropped.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from cairn.errors import WorkspaceError
from cairn.snapshots.exclusions import Exclusions
from cairn.snapshots.models import EntryKind, RootMeta
from cairn.snapshots.stat_cache import StatCache, StatKey

__all__ = ["ScannedEntry", "WorkspaceScan", "scan_workspace", "data_extents"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ScannedEntry:
    path: str
    kind: EntryKind
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    size: int = 0
    target: str | None = None
    extents: tuple[tuple[int, int], ...] | None = None
    stat_key: StatKey | None = None
    digest: str | None = None


@dataclass(slots=True)
class WorkspaceScan:
    root: RootMeta
    entries: list[ScannedEntry]
    started_ns: int
    skipped: list[str] = field(default_factory=list)

    def files_without_digest(self) -> list[ScannedEntry]:
        return [entry for entry in self.entries if entry.kind == "file" and entry.digest is None]


def data_extents(fd: int, size: int) -> tuple[tuple[int, int], ...]:
    """The (offset, length) runs of a file that hold data, found without reading it."""
    extents: list[tuple[int, int]] = []
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:  # ENXIO: only a hole remains up to the end of the file
            break
        end = os.lseek(fd, start, os.SEEK_HOLE)
        extents.append((start, min(end, size) - start))
        offset = end
    return tuple(extents)


def _sparse_extents(path: str, st: os.stat_result) -> tuple[tuple[int, int], ...] | None:
    # Most files are dense; only a file with fewer allocated blocks than its size can have holes.
    if st.st_blocks * 512 >= st.st_size:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        extents = data_extents(fd, st.st_size)
    finally:
        os.close(fd)
    if len(extents) == 1 and extents[0] == (0, st.st_size):
        return None
    return extents


def scan_workspace(workspace: Path, exclusions: Exclusions, stat_cache: StatCache) -> WorkspaceScan:
    started_ns = time.time_ns()
    try:
        root_stat = os.lstat(workspace)
    except OSError as error:
        raise WorkspaceError(f"workspace {workspace} cannot be read: {error.strerror}") from error
    if not stat.S_ISDIR(root_stat.st_mode):
        raise WorkspaceError(f"workspace {workspace} is not a directory (symlinks are not followed)")
    root = RootMeta(
        mode=stat.S_IMODE(root_stat.st_mode),
        uid=root_stat.st_uid,
        gid=root_stat.st_gid,
        mtime_ns=root_stat.st_mtime_ns,
    )
    scan = WorkspaceScan(root=root, entries=[], started_ns=started_ns)
    first_link: dict[tuple[int, int], str] = {}
    try:
        _walk(str(workspace), "", exclusions, stat_cache, scan, first_link)
    except OSError as error:
        raise WorkspaceError(
            f"workspace {workspace} could not be scanned: {error.strerror} ({error.filename})"
        ) from error
    return scan


def _walk(
    directory: str,
    prefix: str,
    exclusions: Exclusions,
    stat_cache: StatCache,
    scan: WorkspaceScan,
    first_link: dict[tuple[int, int], str],
) -> None:
    with os.scandir(directory) as iterator:
        children = sorted(iterator, key=lambda entry: entry.name)
    for child in children:
        relative = f"{prefix}{child.name}"
        if exclusions.is_excluded(relative):
            continue
        st = child.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            scan.entries.append(_entry("dir", relative, st))
            _walk(child.path, f"{relative}/", exclusions, stat_cache, scan, first_link)
        elif stat.S_ISREG(st.st_mode):
            if st.st_nlink > 1:
                inode = (st.st_dev, st.st_ino)
                primary = first_link.get(inode)
                if primary is not None:
                    link = _entry("hardlink", relative, st)
                    link.target = primary
                    scan.entries.append(link)
                    continue
                first_link[inode] = relative
            entry = _entry("file", relative, st)
            entry.size = st.st_size
            entry.extents = _sparse_extents(child.path, st)
            entry.stat_key = StatKey(st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, st.st_dev)
            entry.digest = stat_cache.lookup(relative, entry.stat_key)
            scan.entries.append(entry)
        elif stat.S_ISLNK(st.st_mode):
            link = _entry("symlink", relative, st)
            link.target = os.readlink(child.path)
            scan.entries.append(link)
        elif stat.S_ISFIFO(st.st_mode):
            scan.entries.append(_entry("fifo", relative, st))
        else:
            logger.warning("snapshot skips %r: sockets and device nodes are not snapshotted", relative)
            scan.skipped.append(relative)


def _entry(kind: EntryKind, path: str, st: os.stat_result) -> ScannedEntry:
    return ScannedEntry(
        path=path,
        kind=kind,
        mode=stat.S_IMODE(st.st_mode),
        uid=st.st_uid,
        gid=st.st_gid,
        mtime_ns=st.st_mtime_ns,
    )
