"""The stat listing: what changes its digest, what does not, and when it refuses to give one."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cairn.snapshots import Exclusions
from cairn.snapshots.scan import scan_workspace
from cairn.snapshots.stat_cache import StatCache
from cairn.snapshots.stat_listing import list_workspace, listing_digest
from cairn.snapshots.testing import build_fidelity_workspace
from tests.unit.snapshots.settling import is_settled
from tests.waits import until_blocking

EXCLUSIONS = Exclusions(ephemeral=["cache"])
_OLD_NS = 1_600_000_000 * 10**9


def settle(root: Path) -> None:
    until_blocking(lambda: is_settled(root), f"{root} to leave the racy window")


def listing(root: Path, exclusions: Exclusions = EXCLUSIONS) -> str | None:
    return list_workspace(root, exclusions, time.time_ns())


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "dir").mkdir(parents=True)
    (root / "dir" / "file").write_text("content")
    (root / "other").write_text("other")
    os.symlink("dir/file", root / "link")
    settle(root)
    return root


def rewrite_keeping_size_and_mtime(root: Path) -> None:
    path = root / "dir" / "file"
    before = os.lstat(path)
    path.write_text("CONTENT")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def retarget_link_keeping_length(root: Path) -> None:
    os.unlink(root / "link")
    os.symlink("dir/fil_", root / "link")


CHANGES: dict[str, Callable[[Path], object]] = {
    "content, same size and mtime": rewrite_keeping_size_and_mtime,
    "chmod": lambda root: os.chmod(root / "dir" / "file", 0o600),
    "rename": lambda root: os.rename(root / "other", root / "renamed"),
    "empty dir added": lambda root: (root / "empty-dir").mkdir(),
    "symlink retargeted": retarget_link_keeping_length,
    "hardlink added": lambda root: os.link(root / "other", root / "dir" / "second-name"),
    "fifo added": lambda root: os.mkfifo(root / "pipe"),
    "directory chmod": lambda root: os.chmod(root / "dir", 0o700),
    "root chmod": lambda root: os.chmod(root, 0o700),
    "mtime only": lambda root: os.utime(root / "other", ns=(_OLD_NS, _OLD_NS)),
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_any_change_a_fingerprint_could_see_changes_it(workspace: Path, change: Callable[[Path], object]) -> None:
    before = listing(workspace)
    assert before is not None
    change(workspace)
    settle(workspace)
    assert listing(workspace) != before


def test_excluded_paths_and_directory_times_do_not_change_it(workspace: Path) -> None:
    before = listing(workspace)
    (workspace / "cache").mkdir()
    (workspace / "cache" / "junk").write_text("x")
    (workspace / "dir" / "cache-sibling-gone").write_text("x")
    os.unlink(workspace / "dir" / "cache-sibling-gone")  # moves the directory's mtime and ctime
    os.utime(workspace / "dir", ns=(5, 5))
    settle(workspace)
    assert listing(workspace) == before


def test_it_is_bound_to_the_exclusions(workspace: Path) -> None:
    assert listing(workspace) != listing(workspace, Exclusions(ephemeral=["cache", "elsewhere"]))


def test_a_racy_file_gives_no_listing(workspace: Path) -> None:
    assert listing(workspace) is not None
    (workspace / "other").write_text("just now")
    assert listing(workspace) is None, "a file changed within the racy window must not be vouched for"
    settle(workspace)
    assert listing(workspace) is not None


def test_the_scan_records_the_same_listing_as_the_stat_walk(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    build_fidelity_workspace(root, sparse_size=1024 * 1024)
    (root / "cache").mkdir()
    settle(root)
    scan = scan_workspace(root, EXCLUSIONS, StatCache())
    assert scan.stat_listing() is not None
    assert scan.stat_listing() == listing(root)


def test_the_scan_gives_no_listing_when_a_file_is_racy(workspace: Path) -> None:
    (workspace / "other").write_text("just now")
    assert scan_workspace(workspace, EXCLUSIONS, StatCache()).stat_listing() is None


def test_numbers_beyond_64_bits_give_no_listing_rather_than_a_wrong_one(workspace: Path) -> None:
    root = os.lstat(workspace)
    fields = {"st_mtime_ns": 1, "st_ctime_ns": 1, "st_blocks": 0}
    huge_inode = os.stat_result((stat.S_IFREG | 0o644, 2**64 - 1, 1, 1, 0, 0, 1, 0, 0, 0), fields)
    tree = [("file", str(workspace / "file"), huge_inode)]
    assert listing_digest(root, EXCLUSIONS, time.time_ns(), tree, {}) is None
    ordinary = os.stat_result((stat.S_IFREG | 0o644, 7, 1, 1, 0, 0, 1, 0, 0, 0), fields)
    assert listing_digest(root, EXCLUSIONS, time.time_ns(), [("file", "", ordinary)], {}) is not None


def test_an_unreadable_workspace_gives_no_listing(tmp_path: Path) -> None:
    assert listing(tmp_path / "missing") is None
