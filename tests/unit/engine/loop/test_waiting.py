"""A turn waits for the calls its step's pipeline held, and resumes, from the database, in
another process, once they are released."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from cairn.engine.loop import release_hold
from cairn.engine.loop.waiting import wait_for_holds
from cairn.engine.sessions import SessionService
from cairn.engine.tools import Hold, ToolPolicies
from tests.unit.engine.harness import EngineHarness, PathGate

pytestmark = pytest.mark.anyio

HELD = "held.txt"


def _step(tool: str) -> dict[str, Any]:
    def call(path: str) -> dict[str, Any]:
        arguments = {"path": path, "content": f"{path}\n"} if tool == "write_file" else {"path": path}
        return {"call": tool, "arguments": arguments}

    return {"calls": [call("a.txt"), call(HELD), call("c.txt")]}



# write_file: the step's calls are recorded, then run; read_file: they run ahead of their record.
@pytest.mark.parametrize("tool", ["write_file", "read_file"])
async def test_a_call_held_at_the_gate_waits_and_runs_after_a_restart_once_released(
    engine: EngineHarness, executed: list[str], tool: str
) -> None:
    engine.script([_step(tool), {"say": "done"}])
    files = {"a.txt": "a\n", HELD: "held\n", "c.txt": "c\n"} if tool == "read_file" else {}
    session_id = await engine.create_session(files=files)
    gate = PathGate(HELD)
    await engine.restart(ToolPolicies(gate=gate))
    await engine.run_job()

    # The two others ran; the held one is recorded and not executed; the turn waits.
    assert executed == ["a.txt", "c.txt"] and gate.asked == ["a.txt", HELD, "c.txt"]
    calls = [i for i in await engine.items(session_id) if i.type == "function_call"]
    held = calls[1]
    assert [c.status for c in calls] == ["completed", "in_progress", "completed"]
    outputs = [i.call_id for i in await engine.items(session_id) if i.type == "function_call_output"]
    assert outputs == [calls[0].call_id, calls[2].call_id]
    turn = await engine.turn(held.turn_id)
    assert turn.status == "waiting" and turn.lease_token is None and turn.step == 1
    assert (await engine.session(session_id)).status == "requires_action"
    assert await engine.required_actions(session_id) == [
        {"type": "test_gate_hold", "call_id": held.call_id, "reason": "held by the test", "turn_id": turn.id}
    ]
    if tool == "write_file":
        assert not (engine.workspace(session_id) / HELD).exists()
    events_while_waiting = await engine.events(session_id)

    # A new process; the gate there knows the call was released, and the release resumes the turn.
    gate = PathGate(HELD, released=True)
    await engine.restart(ToolPolicies(gate=gate))
    async with engine.runtime.journal.transaction(session_id) as tx:
        await release_hold(tx, turn.id, str(held.call_id))
    await engine.run_job()

    assert executed == ["a.txt", "c.txt", HELD] and gate.asked == [HELD]
    turn = await engine.turn(turn.id)
    assert turn.status == "completed" and turn.step == 2
    assert (await engine.session(session_id)).status == "idle"
    items = await engine.items(session_id)
    assert [i.status for i in items if i.type == "function_call"] == ["completed"] * 3
    assert sorted(i.call_id for i in items if i.type == "function_call_output") == sorted(c.call_id for c in calls)
    if tool == "write_file":
        assert (engine.workspace(session_id) / HELD).read_text() == f"{HELD}\n"

    # Nothing duplicated: the log continues the one seen while waiting, gap-free, and every
    # item was added once and done at most once.
    events = await engine.events(session_id)
    assert events[: len(events_while_waiting)] == events_while_waiting
    assert [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))
    added = Counter(e["item"]["id"] for e in events if e["type"] == "agent.session.turn.item.added")
    done = Counter(e["item"]["id"] for e in events if e["type"] == "agent.session.turn.item.done")
    assert set(added.values()) == {1} and set(added) == {i.id for i in items}
    assert set(done.values()) == {1}
    assert [e["type"] for e in events].count("agent.session.turn.completed") == 1


async def test_a_client_result_leaves_the_turn_waiting_for_the_gate_alone(engine: EngineHarness) -> None:
    lookup = {"type": "function", "name": "lookup", "description": "", "parameters": {"type": "object", "properties": {}}}
    write = {"call": "write_file", "arguments": {"path": HELD, "content": "x"}}
    engine.script([{"calls": [write, {"call": "lookup", "arguments": {}}]}, {"say": "done"}])
    session_id = await engine.create_session(tools=[lookup])
    await engine.restart(ToolPolicies(gate=PathGate(HELD)))
    await engine.run_job()
    held, client = [i for i in await engine.items(session_id) if i.type == "function_call"]
    assert [a["type"] for a in await engine.required_actions(session_id)] == ["test_gate_hold", "function_call"]

    # The client's result ends its own hold only: the gate still holds its call, so the turn
    # keeps waiting (no job, the session still requires action) for that one alone.
    answer = {"type": "agent.session.input.tool_result", "turn_id": held.turn_id, "call_id": client.call_id, "success": True}
    await SessionService(engine.runtime).submit("t1", session_id, [answer], idempotency=None)
    assert (await engine.turn(held.turn_id)).status == "waiting"
    assert (await engine.session(session_id)).status == "requires_action"
    assert [a["call_id"] for a in await engine.required_actions(session_id)] == [held.call_id]
    assert not await engine.has_job()
    assert not (engine.workspace(session_id) / HELD).exists()

    await engine.restart(ToolPolicies(gate=PathGate(HELD, released=True)))
    async with engine.runtime.journal.transaction(session_id) as tx:
        await release_hold(tx, held.turn_id, str(held.call_id))
    await engine.run_job()
    assert (await engine.turn(held.turn_id)).status == "completed"
    assert (engine.workspace(session_id) / HELD).read_text() == "x"


async def test_a_hold_released_while_another_remains_keeps_the_turn_waiting(engine: EngineHarness) -> None:
    engine.script([{"say": "unused"}])
    session_id = await engine.create_session()
    start, recorder = await engine.begin()
    holds = [PathGate.hold(c) for c in ("call_1", "call_2")]
    async with recorder.write() as tx:
        assert await wait_for_holds(tx, start.job, recorder.turn, holds)
    assert not await engine.has_job()

    async with engine.runtime.journal.transaction(session_id) as tx:
        await release_hold(tx, start.turn.id, "call_1")
    assert (await engine.session(session_id)).status == "requires_action"
    assert [a["call_id"] for a in await engine.required_actions(session_id)] == ["call_2"]
    assert (await engine.turn(start.turn.id)).status == "waiting"
    assert not await engine.has_job()

    async with engine.runtime.journal.transaction(session_id) as tx:
        await release_hold(tx, start.turn.id, "call_2")
    assert (await engine.session(session_id)).status == "in_progress"
    assert await engine.required_actions(session_id) == []
    assert (await engine.turn(start.turn.id)).status == "in_progress"
    assert await engine.has_job()


async def test_a_client_call_answered_while_the_others_ran_is_no_reason_to_wait(engine: EngineHarness) -> None:
    engine.script([{"say": "unused"}])
    session_id = await engine.create_session()
    start, recorder = await engine.begin()
    answered = Hold(call_id="call_gone", action_kind="function_call", action={}, awaits_client=True)
    async with recorder.write() as tx:
        assert not await wait_for_holds(tx, start.job, recorder.turn, [answered])
    assert (await engine.turn(start.turn.id)).status == "in_progress"
    assert (await engine.session(session_id)).status == "in_progress"


async def test_releasing_a_hold_of_a_turn_that_no_longer_waits_changes_nothing(engine: EngineHarness) -> None:
    engine.script([{"say": "done"}])
    session_id = await engine.create_session()
    await engine.run_job()
    items = await engine.items(session_id)
    before = (await engine.session(session_id), await engine.events(session_id))
    async with engine.runtime.journal.transaction(session_id) as tx:
        await release_hold(tx, items[0].turn_id, "call_1")
    assert (await engine.session(session_id), await engine.events(session_id)) == before
    assert not await engine.has_job()
