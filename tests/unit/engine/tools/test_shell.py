"""The shell tool on a fake sandbox: what it asks the sandbox, what it streams, what it returns."""

from __future__ import annotations

import pytest

from cairn.engine.tools import CommandResult
from cairn.engine.tools.shell import MAX_ITEM_OUTPUT, ShellTool
from cairn.engine.tools.workspace import ShellArguments
from cairn.errors import SandboxError
from cairn.models.base import ToolCall
from cairn.sandbox.base import ExecRequest, ExecResult, OutputSink
from tests.unit.engine.harness import EngineHarness

pytestmark = pytest.mark.anyio


@pytest.fixture
def shell(engine: EngineHarness) -> ShellTool:
    return ShellTool(engine.sandbox, engine.runtime.environments.workspace_of, default_timeout_s=42)


async def _run(engine: EngineHarness, shell: ShellTool, streamed: list[str], **arguments: object) -> CommandResult:
    engine.script([{"say": "unused"}])
    session_id = await engine.create_session()
    result = await shell.execute(ShellArguments.model_validate(arguments), await engine.tool_context(session_id, streamed=streamed))
    return result


async def test_a_shell_call_is_recorded_as_a_command_execution(shell: ShellTool) -> None:
    assert shell.call_item(ToolCall("call_1", "shell", {"command": "ls -l"})) == ("command_execution", {
        "command": "ls -l", "cwd": "/workspace", "output": "", "exit_code": None, "duration_ms": None,
        "arguments": '{"command": "ls -l"}',
    })


async def test_output_is_streamed_as_it_comes_and_returned_whole(engine: EngineHarness, shell: ShellTool) -> None:
    engine.sandbox.replies["make"] = ([b"caf", b"\xc3", b"\xa9\n"], 2)  # a character split across chunks
    streamed: list[str] = []
    result = await _run(engine, shell, streamed, command="make", timeout_ms=1500)
    assert streamed == ["caf", "é\n"]
    assert result == CommandResult(output="café\n", exit_code=2, duration_ms=2) and result.status == "failed"
    [request] = engine.sandbox.commands
    assert (request.command, request.timeout_s, request.network) == ("make", 1.5, False)
    assert request.workspace == engine.workspace(next(iter(engine.turn_ids)))


async def test_the_default_timeout_applies_and_a_timeout_is_noted(engine: EngineHarness, shell: ShellTool) -> None:
    async def times_out(request: ExecRequest, on_output: OutputSink) -> ExecResult:
        await on_output(b"partial")
        return ExecResult(exit_code=None, duration_s=42, timed_out=True)

    engine.sandbox.on_exec = times_out
    result = await _run(engine, shell, [], command="sleep 100")
    assert engine.sandbox.commands[0].timeout_s == 42
    assert result.output == "partial\n[timed out after 42 s]" and result.status == "failed"


async def test_output_beyond_the_limit_is_neither_streamed_nor_returned(engine: EngineHarness, shell: ShellTool) -> None:
    engine.sandbox.replies["yes"] = ([b"y" * (MAX_ITEM_OUTPUT - 1), b"yy", b"y" * 10], 0)
    streamed: list[str] = []
    result = await _run(engine, shell, streamed, command="yes")
    assert "".join(streamed).startswith("y" * MAX_ITEM_OUTPUT) and len(streamed) == 3  # the kept part, a 1-char tail, the notice
    assert "neither streamed nor stored" in streamed[-1]
    assert result.output is not None and result.output.endswith(f"[{MAX_ITEM_OUTPUT + 11} characters in all]")
    assert result.output.startswith("y" * MAX_ITEM_OUTPUT + "\n[output beyond")


async def test_a_sandbox_failure_is_the_calls_error_with_the_output_so_far(engine: EngineHarness, shell: ShellTool) -> None:
    async def fails(request: ExecRequest, on_output: OutputSink) -> None:
        await on_output(b"began\n")
        raise SandboxError("no cgroup")

    engine.sandbox.on_exec = fails
    result = await _run(engine, shell, [], command="make")
    assert result == CommandResult(error="began\n\n[sandbox error: no cgroup]") and result.status == "failed"
