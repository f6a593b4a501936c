"""A worker dies in the middle of a call; the worker that takes the turn over closes what
cannot run again, runs again what may, and goes on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from cairn.engine.loop.recovery import INTERRUPTED
from cairn.engine.tools import ToolPolicies
from cairn.models.base import Model, ModelEvent, ModelRequest, ModelResponse, TextDelta
from cairn.sandbox.base import ExecRequest, OutputSink
from tests.unit.engine.harness import EngineHarness, PathGate

pytestmark = pytest.mark.anyio

NOTE = "a small note\n"


async def _die_in_the_command(engine: EngineHarness) -> None:
    """Run the queued job until its `shell` call runs, then end the worker there: no result
    recorded, the job still leased (and its lease already expired, so another worker may
    claim it at once)."""
    crash = anyio.CancelScope()

    async def die(request: ExecRequest, on_output: OutputSink) -> None:
        crash.cancel()
        await anyio.Event().wait()

    engine.sandbox.on_exec = die
    with crash:
        await engine.run_job(lease_s=-1)
    assert crash.cancelled_caught, "the worker never reached the command"
    engine.sandbox.on_exec = None


async def test_a_command_left_running_is_closed_as_interrupted_and_a_read_runs_again(engine: EngineHarness) -> None:
    read = {"call": "read_file", "arguments": {"path": "note.txt"}}
    engine.script([{"calls": [{"call": "shell", "arguments": {"command": "deploy"}}, read]}, {"say": "done"}])
    session_id = await engine.create_session(files={"note.txt": NOTE})
    await _die_in_the_command(engine)
    turn_id = (await engine.items(session_id))[0].turn_id
    assert (await engine.turn(turn_id)).status == "in_progress"

    await engine.restart()
    await engine.run_job()

    items = await engine.items(session_id)
    command = next(i for i in items if i.type == "command_execution")
    assert command.status == "incomplete" and f"[{INTERRUPTED}]" in command.data["output"]
    assert [c.command for c in engine.sandbox.commands] == ["deploy"]  # never run a second time
    outputs = [i.data.get("output") for i in items if i.type == "function_call_output"]
    assert outputs == [NOTE]
    turn = await engine.turn(turn_id)
    assert turn.status == "completed" and turn.step == 2


async def test_a_call_held_at_the_gate_stays_held_through_a_crash(engine: EngineHarness) -> None:
    write = {"call": "write_file", "arguments": {"path": "held.txt", "content": "x"}}
    engine.script([{"calls": [write, {"call": "shell", "arguments": {"command": "deploy"}}]}, {"say": "done"}])
    session_id = await engine.create_session()
    await engine.restart(ToolPolicies(gate=PathGate("held.txt")))
    await _die_in_the_command(engine)

    await engine.restart(ToolPolicies(gate=PathGate("held.txt")))
    await engine.run_job()

    items = await engine.items(session_id)
    held = next(i for i in items if i.type == "function_call")
    command = next(i for i in items if i.type == "command_execution")
    assert held.status == "in_progress" and command.status == "incomplete"
    assert not (engine.workspace(session_id) / "held.txt").exists()
    assert (await engine.turn(held.turn_id)).status == "waiting"
    assert await engine.required_actions(session_id) == [
        {"type": "test_gate_hold", "call_id": held.call_id, "reason": "held by the test", "turn_id": held.turn_id}
    ]


class _DiesWhileStreaming(Model):
    def __init__(self, crash: anyio.CancelScope) -> None:
        self.crash = crash

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        yield TextDelta("hel")
        self.crash.cancel()
        await anyio.Event().wait()
        yield ModelResponse(text="never")


async def test_a_message_a_dead_worker_was_streaming_is_closed_and_the_step_asked_again(engine: EngineHarness) -> None:
    engine.script([{"say": "done"}])
    session_id = await engine.create_session()
    crash = anyio.CancelScope()
    await engine.close()
    await engine.open(resolve=lambda _name: _DiesWhileStreaming(crash))
    with crash:
        await engine.run_job(lease_s=-1)
    assert crash.cancelled_caught

    await engine.restart()
    await engine.run_job()
    messages = [(i.data["role"], i.status) for i in await engine.items(session_id) if i.type == "message"]
    assert messages == [("user", "completed"), ("assistant", "incomplete"), ("assistant", "completed")]
    assert (await engine.turn((await engine.items(session_id))[0].turn_id)).status == "completed"
