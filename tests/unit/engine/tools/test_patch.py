"""The apply_patch grammar: parsing, matching, and all-or-nothing application."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn.engine.tools import run_file_tool
from cairn.engine.tools.patch import apply_hunks, parse_patch
from cairn.engine.workspace_files import WorkspaceFiles
from cairn.errors import InvalidRequestError

pytestmark = pytest.mark.anyio


def test_parse_add_update_move_delete() -> None:
    changes = parse_patch(
        "*** Begin Patch\n*** Add File: new.py\n+print(1)\n*** Update File: a.py\n*** Move to: b.py\n@@ def f\n-x = 1\n+x = 2\n"
        "*** Delete File: old.py\n*** End Patch\n"
    )
    assert [(c.kind, c.path, c.move_to) for c in changes] == [("add", "new.py", None), ("update", "a.py", "b.py"), ("delete", "old.py", None)]
    assert changes[1].hunks[0].anchor == "def f" and changes[1].hunks[0].old == ["x = 1"]


@pytest.mark.parametrize(
    "text",
    ["", "*** Update File: a\n", "*** Begin Patch\n*** End Patch", "*** Begin Patch\n*** Add File: a\nno plus\n*** End Patch",
     "*** Begin Patch\n*** Update File: a\n*** End Patch", "*** Begin Patch\n*** Delete File: a\n+x\n*** End Patch",
     "*** Begin Patch\n*** Update File: a\n?weird\n*** End Patch"],
)
def test_malformed_patches_are_refused(text: str) -> None:
    with pytest.raises(InvalidRequestError):
        parse_patch(text)


def test_hunks_match_in_order_and_tolerate_trailing_whitespace() -> None:
    original = "a\nb  \nc\nb\nd\n"
    hunks = parse_patch("*** Begin Patch\n*** Update File: f\n@@\n c\n-b\n+B\n*** End Patch").pop().hunks
    assert apply_hunks(original, hunks, "f") == "a\nb  \nc\nB\nd\n"
    loose = parse_patch("*** Begin Patch\n*** Update File: f\n@@\n-b\n+X\n*** End Patch").pop().hunks
    assert apply_hunks(original, loose, "f") == "a\nb  \nc\nX\nd\n", "an exact match wins over a loose one"
    assert apply_hunks("a\nb  \nc\n", loose, "f") == "a\nX\nc\n", "trailing whitespace is ignored when nothing matches exactly"


def test_a_hunk_that_does_not_match_names_the_file() -> None:
    hunks = parse_patch("*** Begin Patch\n*** Update File: f\n@@\n-nothing like this\n+x\n*** End Patch").pop().hunks
    with pytest.raises(InvalidRequestError, match="hunk 1 of f"):
        apply_hunks("a\n", hunks, "f")


async def test_a_failing_patch_changes_no_file(tmp_path: Path) -> None:
    files = WorkspaceFiles(tmp_path)
    (tmp_path / "a.txt").write_text("one\n")
    (tmp_path / "b.txt").write_text("two\n")
    patch = (
        "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** Update File: b.txt\n@@\n-missing\n+x\n"
        "*** Add File: c.txt\n+new\n*** End Patch"
    )
    with pytest.raises(InvalidRequestError):
        await run_file_tool("apply_patch", {"patch": patch}, files)
    assert (tmp_path / "a.txt").read_text() == "one\n" and not (tmp_path / "c.txt").exists()


async def test_a_patch_applies_every_change(tmp_path: Path) -> None:
    files = WorkspaceFiles(tmp_path)
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    (tmp_path / "gone.txt").write_text("bye\n")
    patch = (
        "*** Begin Patch\n*** Update File: a.txt\n*** Move to: moved/a.txt\n@@\n one\n-two\n+2\n"
        "*** Delete File: gone.txt\n*** Add File: /workspace/new.txt\n+hello\n*** End Patch"
    )
    summary = await run_file_tool("apply_patch", {"patch": patch}, files)
    assert "R a.txt -> moved/a.txt" in summary
    assert (tmp_path / "moved" / "a.txt").read_text() == "one\n2\n"
    assert not (tmp_path / "a.txt").exists() and not (tmp_path / "gone.txt").exists()
    assert (tmp_path / "new.txt").read_text() == "hello\n"


async def test_patches_cannot_touch_files_outside(tmp_path: Path) -> None:
    files = WorkspaceFiles(tmp_path / "ws")
    (tmp_path / "ws").mkdir()
    with pytest.raises(InvalidRequestError):
        await run_file_tool("apply_patch", {"patch": "*** Begin Patch\n*** Add File: ../x\n+x\n*** End Patch"}, files)
    assert not (tmp_path / "x").exists()
