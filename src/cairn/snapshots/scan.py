"""Walk a live workspace into entries, reading metadata only.

The walk uses `lstat` everywhere, so a symlink is recorded as a link and never followed (an
absolute link into a Python interpreter outside the workspace is just a link). Excluded paths
are not entered. Regular files sharing an inode become one `file` and `hardlink`s to it.
Sparse files get their data extents from SEEK_DATA/SEEK_HOLE so holes are never read.
Digests come from the stat cache when it still vouches for a file; the rest are left for
whoever needs content (persist hashes while storing, the fingerprint check hashes in place).
Sockets and device nodes cannot be restored meaningfully in a sandbox; they are skipped and
reported, never silently dropped. The same walk records the stat listing (`stat_listing`), so
the tree a fingerprint was computed from can later be recognised from a stat walk alone.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from cairn.errors import WorkspaceError
from cairn.snapshots.exclusions import Exclusions
from cairn.snapshots.models import EntryKind, RootMeta
from cairn.snapshots.stat_cache import StatCache, StatKey, stat_key
from cairn.snapshots.stat_listing import WalkedEntry, listing_digest, walk_tree

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
    stat_listing: Callable[[], str | None] = lambda: None
    """Computes the listing digest of this walk (None when racy, see `stat_listing`): a few
    milliseconds of CPU that a persist runs while its fsyncs wait."""

    def stat_cache(self) -> StatCache:
        """The stat cache of this walk: every file whose digest is known by now, unless racy."""
        observations = (
            (entry.path, entry.stat_key, entry.digest)
            for entry in self.entries
            if entry.stat_key is not None and entry.digest is not None
        )
        return StatCache.from_observations(observations, scan_started_ns=self.started_ns)


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
    tree: list[WalkedEntry] = []
    walker = _Walker(stat_cache, scan)
    try:
        walk_tree(str(workspace), "", exclusions.paths, tree)
        walker.walk(tree)
    except OSError as error:
        raise WorkspaceError(
            f"workspace {workspace} could not be scanned: {error.strerror} ({error.filename})"
        ) from error
    scan.stat_listing = partial(listing_digest, root_stat, exclusions, started_ns, tree, walker.targets)
    return scan


class _Walker:
    """One walk of the tree; a class only to keep its per-walk state out of every call's arguments.

    This loop runs once per workspace entry on every persist and full fingerprint, so it does
    the minimum per entry: the `lstat` of the walk and one stat-cache lookup per file.
    """

    def __init__(self, stat_cache: StatCache, scan: WorkspaceScan) -> None:
        self._lookup = stat_cache.lookup
        self._scan = scan
        self._first_link: dict[tuple[int, int], str] = {}
        self.targets: dict[str, str] = {}
        """Relative path -> link target of every symlink, for the stat listing."""

    def walk(self, tree: list[WalkedEntry]) -> None:
        entries = self._scan.entries
        for relative, path, st in tree:
            kind = _KINDS.get(stat.S_IFMT(st.st_mode))
            if kind is None:
                logger.warning("snapshot skips %r: sockets and device nodes are not snapshotted", relative)
                self._scan.skipped.append(relative)
                continue
            entry = ScannedEntry(relative, kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns)
            entries.append(entry)
            if kind == "file":
                self._file(entry, path, st)
            elif kind == "symlink":
                entry.target = self.targets[relative] = os.readlink(path)

    def _file(self, entry: ScannedEntry, path: str, st: os.stat_result) -> None:
        if st.st_nlink > 1:
            inode = (st.st_dev, st.st_ino)
            primary = self._first_link.get(inode)
            if primary is not None:
                entry.kind = "hardlink"
                entry.target = primary
                return
            self._first_link[inode] = entry.path
        entry.size = st.st_size
        if st.st_blocks * 512 < st.st_size:  # only then can it have holes
            entry.extents = _sparse_extents(path, st)
        entry.stat_key = key = stat_key(st)
        entry.digest = self._lookup(entry.path, key)


_KINDS: dict[int, EntryKind] = {
    stat.S_IFDIR: "dir",
    stat.S_IFREG: "file",
    stat.S_IFLNK: "symlink",
    stat.S_IFIFO: "fifo",
}
