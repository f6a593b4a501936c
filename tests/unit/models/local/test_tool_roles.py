"""Tool roles are read from parameters, whatever the tools are called."""

from __future__ import annotations

from typing import Any

from cairn.models.base import ToolSpec
from cairn.models.local._tool_roles import runner_name, writes_files


def _tool(name: str, *arguments: str) -> ToolSpec:
    parameters: dict[str, Any] = {"type": "object", "properties": {a: {"type": "string"} for a in arguments}}
    return ToolSpec(name=name, description="", parameters=parameters, kind="client")


def test_the_runner_is_the_first_tool_taking_a_command_or_cmd() -> None:
    save, run, exec_ = _tool("save", "path", "content"), _tool("run", "cmd"), _tool("exec", "command", "timeout_ms")
    assert runner_name([save, run, exec_]) == "run"
    assert runner_name([save, exec_, run]) == "exec"
    assert runner_name([save, _tool("patch", "patch")]) is None


def test_a_file_writer_takes_a_path_and_a_content() -> None:
    assert writes_files(_tool("put", "content", "path", "mode"))
    assert not writes_files(_tool("read", "path"))
    assert not writes_files(_tool("note", "content"))
