"""Host-side file access never leaves the workspace, whatever the workspace contains."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cairn.engine.workspace_files import PathEscapeError, WorkspaceFiles, workspace_relative
from cairn.errors import InvalidRequestError


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside"
    target.mkdir()
    (target / "secret.txt").write_text("host secret")
    return target


@pytest.fixture
def files(tmp_path: Path) -> WorkspaceFiles:
    root = tmp_path / "ws"
    root.mkdir()
    return WorkspaceFiles(root)


@pytest.mark.parametrize(
    ("path", "expected"),
    [("/workspace/a/b.txt", "a/b.txt"), ("a/./b.txt", "a/b.txt"), ("/workspace", ""), ("a/../b", "b"), ("/workspace/x/../y", "y")],
)
def test_paths_are_normalised_inside_the_workspace(path: str, expected: str) -> None:
    assert workspace_relative(path) == expected


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../../x", "/workspace/../etc", "/workspacex/a", "/"])
def test_paths_outside_are_refused(path: str) -> None:
    with pytest.raises(PathEscapeError):
        workspace_relative(path)


def test_write_then_read_creates_parent_directories(files: WorkspaceFiles) -> None:
    files.write_bytes("/workspace/deep/er/file.txt", b"content")
    assert files.read_bytes("deep/er/file.txt", max_bytes=100) == b"content"


def test_a_symlinked_directory_pointing_out_is_refused(files: WorkspaceFiles, outside: Path) -> None:
    os.symlink(outside, files.root / "escape")
    with pytest.raises(PathEscapeError):
        files.read_bytes("escape/secret.txt", max_bytes=100)
    with pytest.raises(PathEscapeError):
        files.write_bytes("escape/new.txt", b"x")
    assert not (outside / "new.txt").exists()


def test_a_final_symlink_pointing_out_is_refused_for_read_and_write(files: WorkspaceFiles, outside: Path) -> None:
    os.symlink(outside / "secret.txt", files.root / "link.txt")
    with pytest.raises(PathEscapeError):
        files.read_bytes("link.txt", max_bytes=100)
    with pytest.raises(PathEscapeError):
        files.write_bytes("link.txt", b"overwritten")
    assert (outside / "secret.txt").read_text() == "host secret"


def test_absolute_symlinks_are_read_as_workspace_paths(files: WorkspaceFiles) -> None:
    files.write_bytes("real/data.txt", b"inside")
    os.symlink("/workspace/real", files.root / "alias")
    os.symlink("/workspace/real/data.txt", files.root / "file-alias")
    assert files.read_bytes("alias/data.txt", max_bytes=100) == b"inside"
    assert files.read_bytes("file-alias", max_bytes=100) == b"inside"
    files.write_bytes("file-alias", b"changed through the link")
    assert (files.root / "real" / "data.txt").read_bytes() == b"changed through the link"


def test_relative_symlinks_climbing_out_are_refused(files: WorkspaceFiles) -> None:
    (files.root / "a").mkdir()
    os.symlink("../../..", files.root / "a" / "up")
    with pytest.raises(PathEscapeError):
        files.read_bytes("a/up/etc/passwd", max_bytes=100)


def test_symlink_loops_end_with_an_error(files: WorkspaceFiles) -> None:
    os.symlink("loop2", files.root / "loop1")
    os.symlink("loop1", files.root / "loop2")
    with pytest.raises(InvalidRequestError):
        files.read_bytes("loop1/x", max_bytes=100)


def test_reading_limits_and_kinds(files: WorkspaceFiles) -> None:
    files.write_bytes("big.bin", b"x" * 101)
    with pytest.raises(InvalidRequestError, match="larger"):
        files.read_bytes("big.bin", max_bytes=100)
    (files.root / "dir").mkdir()
    with pytest.raises(InvalidRequestError):
        files.read_bytes("dir", max_bytes=100)
    with pytest.raises(InvalidRequestError, match="no such file"):
        files.read_bytes("missing.txt", max_bytes=100)


def test_listing_never_follows_symlinks(files: WorkspaceFiles, outside: Path) -> None:
    files.write_bytes("outputs/a.txt", b"a")
    files.write_bytes("outputs/sub/b.txt", b"b")
    os.symlink(outside, files.root / "outputs" / "host")
    os.symlink(outside / "secret.txt", files.root / "outputs" / "secret.txt")
    assert [f.path for f in files.regular_files("outputs")] == ["outputs/a.txt", "outputs/sub/b.txt"]


def test_an_outputs_symlink_pointing_out_lists_nothing_outside(files: WorkspaceFiles, outside: Path) -> None:
    os.symlink(outside, files.root / "outputs")
    assert list(files.regular_files("outputs")) == []


def test_a_fifo_in_the_workspace_is_refused_instead_of_hanging(files: WorkspaceFiles) -> None:
    # Opening a FIFO for reading, or for writing with no reader, would block forever.
    os.mkfifo(files.root / "pipe")
    with pytest.raises(InvalidRequestError, match="not a regular file"):
        files.read_bytes("pipe", max_bytes=10)
    with pytest.raises(InvalidRequestError, match="not a regular file"):
        files.write_bytes("pipe", b"x")
    with pytest.raises(InvalidRequestError, match="not a regular file"):
        files.open_regular("pipe")
    assert (files.root / "pipe").is_fifo()
