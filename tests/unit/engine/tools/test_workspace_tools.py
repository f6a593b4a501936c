"""Workspace tool schemas and argument validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn.engine.tools import WORKSPACE_TOOL_NAMES, parse_shell_arguments, run_file_tool, workspace_tool_specs
from cairn.engine.workspace_files import WorkspaceFiles
from cairn.errors import InvalidRequestError

pytestmark = pytest.mark.anyio


def test_every_tool_has_an_object_schema_without_titles() -> None:
    specs = {s.name: s for s in workspace_tool_specs()}
    assert set(specs) == WORKSPACE_TOOL_NAMES == {"shell", "read_file", "write_file", "apply_patch"}
    assert specs["shell"].parameters["required"] == ["command"]
    assert all(s.parameters["type"] == "object" and "title" not in s.parameters for s in specs.values())


def test_each_turn_gets_its_own_copy_of_the_schemas() -> None:
    first, second = workspace_tool_specs(), workspace_tool_specs()
    first[0].parameters["properties"].clear()  # type: ignore[attr-defined]
    assert second[0].parameters["properties"] and workspace_tool_specs()[0].parameters["properties"]


@pytest.mark.parametrize("arguments", [{}, {"command": ""}, {"command": "ls", "timeout_ms": 0}, {"command": 5}, {"command": "ls", "x": 1}])
def test_bad_shell_arguments_are_tool_errors(arguments: dict[str, object]) -> None:
    with pytest.raises(InvalidRequestError, match="invalid arguments for shell"):
        parse_shell_arguments(arguments)


async def test_file_tools_round_trip_and_report_errors(tmp_path: Path) -> None:
    files = WorkspaceFiles(tmp_path)
    assert "wrote 2 bytes" in await run_file_tool("write_file", {"path": "/workspace/a.txt", "content": "hi"}, files)
    assert await run_file_tool("read_file", {"path": "a.txt"}, files) == "hi"
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    with pytest.raises(InvalidRequestError, match="UTF-8"):
        await run_file_tool("read_file", {"path": "bin"}, files)
    with pytest.raises(InvalidRequestError, match="invalid arguments for write_file"):
        await run_file_tool("write_file", {"path": "a.txt"}, files)
