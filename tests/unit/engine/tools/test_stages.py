"""Each stage of the pipeline alone: validate, gate, reserve, execute and record."""

from __future__ import annotations

from typing import Any

import pytest

from cairn.engine.loop.step import session_toolbox
from cairn.engine.tools import PROCEED, AllowEveryCall, CallInFlight, CommandResult, Finish, Hold, ReserveNothing, ToolResult
from cairn.engine.tools.execute import ExecuteStage
from cairn.engine.tools.record import RecordStage
from cairn.engine.tools.validate import ValidateStage
from cairn.errors import CairnMisuseError
from cairn.models.base import ModelResponse, ToolCall
from tests.unit.engine.harness import EngineHarness

pytestmark = pytest.mark.anyio

_CLIENT_TOOL = {"type": "function", "name": "lookup", "description": "", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture
async def session_id(engine: EngineHarness) -> str:
    engine.script([{"say": "unused"}])
    session_id = await engine.create_session(files={"note.txt": "note"}, tools=[_CLIENT_TOOL])
    await engine.prepare_workspace(session_id)
    return session_id


async def _call(engine: EngineHarness, session_id: str, name: str, **arguments: Any) -> CallInFlight:
    """A call of the session's turn that is not recorded (as in a step run ahead)."""
    context = await engine.tool_context(session_id)
    tool = session_toolbox(engine.runtime, context.session).get(name)
    return CallInFlight(ToolCall("call_1", name, arguments), tool, context)


async def _validated(engine: EngineHarness, session_id: str, name: str, **arguments: Any) -> CallInFlight:
    call = await _call(engine, session_id, name, **arguments)
    assert await ValidateStage().run(call) is PROCEED
    return call


async def test_validate_refuses_an_unknown_tool_with_the_tools_there_are(engine: EngineHarness, session_id: str) -> None:
    verdict = await ValidateStage().run(await _call(engine, session_id, "deploy"))
    assert verdict == Finish(ToolResult(error="unknown tool 'deploy'; available tools: shell, write_file, read_file, apply_patch, lookup"))


async def test_validate_refuses_bad_arguments_and_parses_good_ones(engine: EngineHarness, session_id: str) -> None:
    verdict = await ValidateStage().run(await _call(engine, session_id, "write_file", path="a.txt"))
    assert isinstance(verdict, Finish) and verdict.result.error == "invalid arguments for write_file: content: Field required"
    call = await _validated(engine, session_id, "shell", command="ls", timeout_ms=5)
    assert (call.arguments.command, call.arguments.timeout_ms) == ("ls", 5)
    client = await _validated(engine, session_id, "lookup", anything=[1])  # the client judges its own arguments
    assert client.arguments == {"anything": [1]}


async def test_the_default_gate_lets_every_call_through_and_holds_none(engine: EngineHarness, session_id: str) -> None:
    gate = AllowEveryCall()
    call = await _validated(engine, session_id, "write_file", path="a.txt", content="x")
    assert await gate.run(call) is PROCEED and not await gate.vouches_for_rerun(call)


async def test_the_default_reservation_claims_nothing(engine: EngineHarness, session_id: str) -> None:
    reserve = ReserveNothing()
    call = await _validated(engine, session_id, "write_file", path="a.txt", content="x")
    assert await reserve.run(call) is PROCEED and not await reserve.vouches_for_rerun(call)


async def test_execute_runs_a_workspace_tool_and_finishes_the_call(engine: EngineHarness, session_id: str) -> None:
    execute = ExecuteStage()
    read = await _validated(engine, session_id, "read_file", path="note.txt")
    assert await execute.run(read) == Finish(ToolResult(output="note"))
    missing = await execute.run(await _validated(engine, session_id, "read_file", path="missing.txt"))
    assert isinstance(missing, Finish) and missing.result.error is not None and "no such file" in missing.result.error
    write = await _validated(engine, session_id, "write_file", path="a.txt", content="x")
    assert await execute.run(write) == Finish(ToolResult(output="wrote 1 bytes to /workspace/a.txt"))
    assert (engine.workspace(session_id) / "a.txt").read_text() == "x"
    # Only a read may run again after a crash.
    assert await execute.vouches_for_rerun(read) and not await execute.vouches_for_rerun(write)


async def test_execute_hands_a_client_call_to_the_client(engine: EngineHarness, session_id: str) -> None:
    call = await _validated(engine, session_id, "lookup", q="é")
    verdict = await ExecuteStage().run(call)
    assert verdict == Hold(
        call_id="call_1", action_kind="function_call", action={"name": "lookup", "arguments": '{"q": "é"}'}, awaits_client=True
    )


async def test_record_ends_a_function_call_with_its_output_item(engine: EngineHarness, session_id: str) -> None:
    start, recorder = await engine.begin()
    toolbox = session_toolbox(engine.runtime, start.session)
    calls = (ToolCall("call_a", "read_file", {"path": "note.txt"}), ToolCall("call_b", "shell", {"command": "ls"}))
    items = await recorder.record_step(None, ModelResponse(text=None, tool_calls=calls), [toolbox.get(c.name) for c in calls], None)
    record = RecordStage(recorder)
    context = await engine.tool_context(session_id)
    await record.record(CallInFlight(calls[0], toolbox.get("read_file"), context, item=items[0]), ToolResult(error="gone"))
    await record.record(
        CallInFlight(calls[1], toolbox.get("shell"), context, item=items[1]), CommandResult(output="a\n", exit_code=1, duration_ms=7)
    )
    stored = {(i.type, i.call_id): i for i in await engine.items(session_id)}
    assert stored["function_call", "call_a"].status == "failed"
    assert stored["function_call_output", "call_a"].data == {"call_id": "call_a", "error": "gone"}
    command = stored["command_execution", "call_b"]
    assert command.status == "failed" and (command.data["output"], command.data["exit_code"], command.data["duration_ms"]) == ("a\n", 1, 7)
    assert recorder.open_calls() == []
    with pytest.raises(CairnMisuseError, match="recorded before"):
        await record.record(CallInFlight(calls[0], toolbox.get("read_file"), context), ToolResult(output="x"))


async def test_a_refused_command_shows_the_refusal_as_its_output(engine: EngineHarness, session_id: str) -> None:
    start, recorder = await engine.begin()
    toolbox = session_toolbox(engine.runtime, start.session)
    call = ToolCall("call_a", "shell", {"command": 5})
    [item] = await recorder.record_step(None, ModelResponse(text=None, tool_calls=(call,)), [toolbox.get("shell")], None)
    assert item.data["command"] == '{"command": 5}'  # what the model sent, as it sent it
    in_flight = CallInFlight(call, toolbox.get("shell"), await engine.tool_context(session_id), item=item)
    verdict = await ValidateStage().run(in_flight)
    assert isinstance(verdict, Finish)
    await RecordStage(recorder).record(in_flight, verdict.result)
    command = (await engine.items(session_id))[-1]
    assert command.status == "failed" and command.data["exit_code"] is None and command.data["duration_ms"] == 0
    assert command.data["output"].startswith("invalid arguments for shell: command:")
