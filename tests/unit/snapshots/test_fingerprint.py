"""The fingerprint: what changes it, what does not, and that it needs no unchanged reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cairn.snapshots import Exclusions, environment_manifest_digest
from cairn.snapshots import fingerprint as fingerprint_module
from cairn.snapshots.fingerprint import FINGERPRINT_VERSION, fingerprint_workspace
from cairn.snapshots.stat_cache import RACY_WINDOW_NS, StatCache, StatKey


def fp(workspace: Path, manifest: str = "m", cache: StatCache | None = None) -> str:
    return fingerprint_workspace(workspace, Exclusions(ephemeral=["cache"]), cache or StatCache(), manifest)[0]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "dir").mkdir(parents=True)
    (root / "dir" / "file").write_text("content")
    os.symlink("dir/file", root / "link")
    return root


def test_version_is_named() -> None:
    assert FINGERPRINT_VERSION.endswith("-v2")


@pytest.mark.parametrize(
    "change",
    [
        lambda root: (root / "dir" / "file").write_text("CONTENT"),
        lambda root: os.chmod(root / "dir" / "file", 0o600),
        lambda root: os.utime(root / "dir" / "file", ns=(1, 1)),
        lambda root: (os.unlink(root / "link"), os.symlink("elsewhere", root / "link")),
        lambda root: (root / "new").write_text(""),
        lambda root: (root / "empty-dir").mkdir(),
        lambda root: os.chmod(root, 0o700),
    ],
)
def test_any_restorable_difference_changes_it(workspace: Path, change: object) -> None:
    before = fp(workspace)
    change(workspace)  # type: ignore[operator]
    assert fp(workspace) != before


def test_excluded_paths_and_directory_mtimes_do_not_change_it(workspace: Path) -> None:
    before = fp(workspace)
    (workspace / "cache").mkdir()
    (workspace / "cache" / "junk").write_text("x")
    os.utime(workspace / "dir", ns=(5, 5))
    assert fp(workspace) == before


def test_it_is_bound_to_the_environment_manifest(workspace: Path) -> None:
    assert fp(workspace, environment_manifest_digest({"a": 1})) != fp(workspace, environment_manifest_digest({"a": 2}))
    assert environment_manifest_digest({"a": 1, "b": 2}) == environment_manifest_digest({"b": 2, "a": 1})


def test_unchanged_files_are_not_read_again(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cairn.snapshots.stat_cache.RACY_WINDOW_NS", 0)
    first, cache, _ = fingerprint_workspace(workspace, Exclusions(), StatCache(), "m")
    assert len(cache) == 1
    monkeypatch.setattr(fingerprint_module, "hash_stored_content", lambda *args: pytest.fail("read a file"))
    assert fingerprint_workspace(workspace, Exclusions(), cache, "m")[0] == first


def test_racy_entries_are_not_cached() -> None:
    key = StatKey(size=1, mtime_ns=0, ino=1, ctime_ns=1_000, dev=1)
    settled = StatKey(size=1, mtime_ns=0, ino=2, ctime_ns=1_000 - RACY_WINDOW_NS - 1, dev=1)
    cache = StatCache.from_observations([("racy", key, "d1"), ("settled", settled, "d2")], scan_started_ns=1_000)
    assert cache.lookup("racy", key) is None
    assert cache.lookup("settled", settled) == "d2"
    assert cache.lookup("settled", StatKey(size=1, mtime_ns=0, ino=2, ctime_ns=5, dev=1)) is None
    assert StatCache.from_json(cache.to_json()).lookup("settled", settled) == "d2"
