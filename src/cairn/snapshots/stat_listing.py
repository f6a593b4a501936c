"""The stat listing: one digest of what `lstat` says about every entry of a workspace.

It lets the skip check decide "unchanged" from a stat walk alone. When the state file was
saved, it recorded the fingerprint of the tree *and* the listing digest of the very scan that
fingerprint was computed from. If a fresh walk yields the same listing digest, every entry has
the same name, kind, mode, owner, size, mtime, inode, ctime, device, link count, block count
and link target as then, so by the stat cache's premise (an unchanged (size, mtime, inode,
ctime, device) means unchanged content) the live fingerprint *is* the recorded one: no
per-file cache lookups, no canonical encoding, no parse of the stat cache.

That premise only holds for files that were not racy (`stat_cache.settled`): a scan whose
newest file ctime is too close to its start yields no listing digest, and the next check takes
the full fingerprint path. Directories contribute only mode and owner (their size, mtime and
ctime move when an excluded path inside them changes, which must not matter); what they
contain is listed entry by entry. The encoding is native-endian machine integers: the listing
is compared only with one saved on the same machine, and an inode number or time that does not
fit in 64 signed bits yields no digest (the full path decides), never a wrong one.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from array import array
from collections.abc import Mapping
from pathlib import Path

from cairn.snapshots.exclusions import Exclusions
from cairn.snapshots.stat_cache import settled

__all__ = ["LISTING_VERSION", "WalkedEntry", "list_workspace", "listing_digest", "walk_tree"]

# Part of every digest: changing the encoding below needs a new version (old digests never match).
LISTING_VERSION = "cairn-stat-listing-v1"

WalkedEntry = tuple[str, str, os.stat_result]
"""(relative path, path, lstat) of one entry."""


def walk_tree(directory: str, prefix: str, excluded: frozenset[str], into: list[WalkedEntry]) -> None:
    """Append every entry below `directory` to `into`, names sorted, each directory before its contents.

    Excluded paths are left out and never entered; symlinks are never followed. The scan and
    the stat listing both walk with this one function, so they see the same entries in the
    same order. It fills a list rather than yielding: this runs once per entry on every skip
    check, and nested generators cost a frame switch per level for every entry.
    """
    with os.scandir(directory) as iterator:
        children = sorted(iterator, key=lambda entry: entry.name)
    for child in children:
        relative = f"{prefix}{child.name}"
        if excluded and relative in excluded:
            continue
        st = child.stat(follow_symlinks=False)
        into.append((relative, child.path, st))
        if stat.S_ISDIR(st.st_mode):
            walk_tree(child.path, f"{relative}/", excluded, into)


def listing_digest(
    root: os.stat_result,
    exclusions: Exclusions,
    started_ns: int,
    tree: list[WalkedEntry],
    targets: Mapping[str, str],
) -> str | None:
    """The digest of a walk (`targets`: relative path -> link target of each symlink).

    None when the walk cannot be trusted: a file changed within the racy window before
    `started_ns` (when the walk began), or a number that does not fit the encoding.
    """
    header = [LISTING_VERSION, sorted(exclusions.paths), root.st_mode, root.st_uid, root.st_gid]
    names: list[str] = []
    numbers = array("q")
    newest_file_ctime_ns = 0
    name, extend = names.append, numbers.extend
    try:
        for relative, _, st in tree:
            name(relative)
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                extend((mode, st.st_uid, st.st_gid))
                continue
            # st[:7] is (mode, ino, dev, nlink, uid, gid, size) in one C call; atime is left out.
            extend(st[:7])
            extend((st.st_mtime_ns, st.st_ctime_ns, st.st_blocks))
            if stat.S_ISLNK(mode):
                name(targets[relative])
            elif stat.S_ISREG(mode) and st.st_ctime_ns > newest_file_ctime_ns:
                newest_file_ctime_ns = st.st_ctime_ns
    except OverflowError:
        return None
    if not settled(newest_file_ctime_ns, scan_started_ns=started_ns):
        return None
    encoded = numbers.tobytes()
    # The mode that opens each record says how many numbers and names follow, and names never
    # contain NUL: the byte stream has exactly one reading.
    hasher = hashlib.sha256(json.dumps(header, ensure_ascii=True).encode())
    hasher.update(len(encoded).to_bytes(8, "little"))
    hasher.update(encoded)
    hasher.update("\0".join(names).encode("utf-8", "surrogateescape"))
    return hasher.hexdigest()


def list_workspace(workspace: Path, exclusions: Exclusions, started_ns: int) -> str | None:
    """The listing digest of the live workspace, or None when it cannot be trusted or read.

    `started_ns` is when the caller began looking (`time.time_ns()`), for the racy check.
    """
    tree: list[WalkedEntry] = []
    try:
        root = os.lstat(workspace)
        walk_tree(str(workspace), "", exclusions.paths, tree)
        targets = {relative: os.readlink(path) for relative, path, st in tree if stat.S_ISLNK(st.st_mode)}
    except OSError:
        return None  # e.g. an entry vanished mid-walk: the full fingerprint path decides
    return listing_digest(root, exclusions, started_ns, tree, targets)
