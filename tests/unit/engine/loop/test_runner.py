"""The runner drives a turn to its end: completed, failed, cancelled, or left to another
worker once its lease is lost."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import sqlalchemy as sa

from cairn.engine.loop import TurnRunner
from cairn.engine.runtime import Runtime
from cairn.models.base import Model, ModelEvent, ModelRequest, ModelResponse, ToolCall
from cairn.sandbox.base import ExecRequest, OutputSink
from cairn.store.tables import turns
from tests.unit.engine.harness import EngineHarness, call_events

pytestmark = pytest.mark.anyio


async def test_a_turn_runs_its_steps_and_completes(engine: EngineHarness) -> None:
    engine.script([{"call": "write_file", "arguments": {"path": "a.txt", "content": "a\n"}}, {"say": "done"}])
    session_id = await engine.create_session()
    await engine.run_job()
    types = [e["type"].removeprefix("agent.session.") for e in await engine.events(session_id)]
    assert types[types.index("turn.in_progress") :] == [
        "turn.in_progress",
        "turn.item.added",  # the user's message
        "turn.item.added", "turn.item.done", "turn.item.added",  # the call, then it is done, with its output
        "turn.item.added", "turn.content_part.added", "turn.output_text.delta",  # the answer
        "turn.output_text.done", "turn.content_part.done", "turn.item.done",
        "turn.completed",
        "idle",
    ]
    assert (engine.workspace(session_id) / "a.txt").read_text() == "a\n"
    items = await engine.items(session_id)
    turn = await engine.turn(items[0].turn_id)
    assert turn.status == "completed" and turn.step == 2 and turn.lease_token is None
    assert (await engine.session(session_id)).status == "idle"
    assert not await engine.has_job()


async def test_a_script_that_runs_out_fails_the_turn(engine: EngineHarness) -> None:
    engine.script([{"call": "read_file", "arguments": {"path": "a.txt"}}])
    session_id = await engine.create_session(files={"a.txt": "a"})
    await engine.run_job()
    turn = await engine.turn((await engine.items(session_id))[0].turn_id)
    assert turn.status == "failed" and turn.error is not None and turn.error["code"] == "invalid_request"
    assert "ran out" in turn.error["message"]
    assert (await engine.session(session_id)).status == "idle"


async def test_a_read_that_fails_unexpectedly_fails_the_turn_and_leaves_its_call_on_record(
    engine: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_args: Any) -> str:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("cairn.engine.tools.workspace._run_parsed", broken)
    engine.script([{"call": "read_file", "arguments": {"path": "note.txt"}}, {"say": "done"}])
    session_id = await engine.create_session(files={"note.txt": "x"})
    await engine.run_job()
    items = await engine.items(session_id)
    turn = await engine.turn(items[-1].turn_id)
    assert [(i.type, i.status) for i in items if i.type == "function_call"] == [("function_call", "incomplete")]
    assert turn.status == "failed" and turn.step == 1
    assert turn.error == {"code": "internal_error", "message": "internal error: OSError"}


async def test_a_cancel_request_stops_the_running_command_and_cancels_the_turn(engine: EngineHarness) -> None:
    async def hang_until_cancelled(request: ExecRequest, on_output: OutputSink) -> None:
        await on_output(b"started\n")
        async with engine.runtime.db.write() as conn:
            await conn.execute(sa.update(turns).values(cancel_requested=True))
        await anyio.Event().wait()  # the runner's cancellation watch ends this

    engine.sandbox.on_exec = hang_until_cancelled
    engine.script([{"call": "shell", "arguments": {"command": "sleep 60"}}, {"say": "unused"}])
    session_id = await engine.create_session()
    await engine.run_job()
    items = await engine.items(session_id)
    command = next(i for i in items if i.type == "command_execution")
    assert command.status == "incomplete" and "[turn cancelled]" in command.data["output"]
    assert (await engine.turn(command.turn_id)).status == "cancelled"
    assert (await engine.session(session_id)).status == "idle"
    assert "started\n" in [e.get("delta") for e in await engine.events(session_id)]


class _LeaseTakenModel(Model):
    """Asks for a read, after another worker took the turn over (as a new claim of its job would)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        async with self.runtime.db.write() as conn:
            await conn.execute(sa.update(turns).where(turns.c.id == request.turn_id).values(lease_token=turns.c.lease_token + 1))
        yield ModelResponse(text=None, tool_calls=(ToolCall("call_1", "read_file", {"path": "note.txt"}),))


async def test_a_step_is_not_recorded_once_the_lease_is_lost(engine: EngineHarness) -> None:
    engine.script([{"say": "unused"}])
    session_id = await engine.create_session(files={"note.txt": "x"})
    await engine.close()
    await engine.open(resolve=lambda _name: _LeaseTakenModel(engine.runtime))
    batches = await engine.run_job()
    items = await engine.items(session_id)
    turn = await engine.turn(items[0].turn_id)
    assert [i.type for i in items] == ["message"]  # the user's input, nothing of the step
    assert turn.status == "in_progress" and turn.step == 0
    assert not any(call_events(b) for b in batches)


async def test_a_draining_worker_hands_the_job_back_at_the_next_step_boundary(engine: EngineHarness) -> None:
    engine.script([
        {"call": "shell", "arguments": {"command": "first"}},
        {"call": "shell", "arguments": {"command": "second"}},
        {"say": "done"},
    ])
    session_id = await engine.create_session()
    stopping = anyio.Event()

    async def stop_after_the_first(request: ExecRequest, on_output: OutputSink) -> None:
        stopping.set()  # the worker starts draining while the first step's command runs

    engine.sandbox.on_exec = stop_after_the_first
    job = await engine.claim()
    await TurnRunner(engine.runtime).run(job, stopping)
    [first] = engine.sandbox.commands
    assert first.command == "first"  # the step that was running finished and was recorded
    items = await engine.items(session_id)
    turn = await engine.turn(items[0].turn_id)
    assert turn.status == "in_progress" and turn.step == 1
    assert [(i.type, i.status) for i in items if i.type == "command_execution"] == [("command_execution", "completed")]
    # Handed back, not completed: the next worker claims it at once and finishes the turn.
    engine.sandbox.on_exec = None
    await engine.run_job()
    assert [c.command for c in engine.sandbox.commands] == ["first", "second"]
    assert (await engine.turn(turn.id)).status == "completed"
    events = await engine.events(session_id)
    assert [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))
    added = [e["item"]["id"] for e in events if e["type"] == "agent.session.turn.item.added"]
    assert len(added) == len(set(added))
