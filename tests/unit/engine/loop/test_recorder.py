"""The recorder: the turn's history and run state, and every write fenced by the lease."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from cairn.engine.tools import Hold, ToolResult
from cairn.engine.tools.client import ClientTool
from cairn.engine.tools.toolbox import Toolbox
from cairn.errors import LeaseLostError
from cairn.models.base import ModelResponse, ToolCall, ToolSpec, Usage
from cairn.store.tables import turns
from tests.unit.engine.harness import EngineHarness, call_events

pytestmark = pytest.mark.anyio

_CLIENT = ClientTool(ToolSpec(name="lookup", description="", parameters={}, kind="client"))


async def test_a_step_is_recorded_with_its_run_state_in_one_transaction(engine: EngineHarness) -> None:
    engine.script([{"say": "unused"}])
    session_id = await engine.create_session()
    start, recorder = await engine.begin()
    write = Toolbox([]).get("write_file")  # unknown here: still recorded as a call
    calls = (ToolCall("call_a", "write_file", {"path": "a"}), ToolCall("call_b", "lookup", {"q": 1}))
    response = ModelResponse(text="on it", tool_calls=calls, usage=Usage(input_tokens=3, output_tokens=2))
    with engine.runtime.notifier.subscribe(session_id) as subscription:
        items = await recorder.record_step(None, response, [write, _CLIENT], None)
        published, _ = subscription.take()
    assert len(published) == 1  # one transaction
    assert call_events([json.loads(r.data) for r in published[0].records]) == [
        ("added", "function_call", "in_progress"),
        ("added", "function_call", "in_progress"),
        ("done", "function_call", "in_progress"),  # the client's call is handed over as it is
    ]
    assert [(i.type, i.tool_kind, i.output_index) for i in items] == [("function_call", "workspace", 1), ("function_call", "client", 2)]
    turn = await engine.turn(start.turn.id)
    assert (turn.step, turn.next_output_index) == (1, 3)
    assert turn.usage is not None and (turn.usage["input_tokens"], turn.usage["output_tokens"]) == (3, 2)
    assert recorder.open_calls() == items
    message = (await engine.items(session_id))[1]
    assert (message.type, message.data["phase"], message.data["content"][0]["text"]) == ("message", "commentary", "on it")


async def test_results_of_a_step_run_ahead_are_stored_finished_and_a_held_call_open(engine: EngineHarness) -> None:
    engine.script([{"say": "unused"}])
    session_id = await engine.create_session()
    start, recorder = await engine.begin()
    tool = Toolbox([]).get("read_file")
    calls = (ToolCall("call_a", "read_file", {}), ToolCall("call_b", "read_file", {}))
    outcomes = [ToolResult(output="text"), Hold(call_id="call_b", action_kind="test", action={})]
    items = await recorder.record_step(None, ModelResponse(text=None, tool_calls=calls), [tool, tool], outcomes)
    assert [(i.call_id, i.status) for i in items] == [("call_a", "completed"), ("call_b", "in_progress")]
    stored = [(i.type, i.call_id, i.status) for i in await engine.items(session_id) if i.call_id]
    assert stored == [
        ("function_call", "call_a", "completed"), ("function_call", "call_b", "in_progress"),
        ("function_call_output", "call_a", "completed"),
    ]
    assert [i.call_id for i in recorder.open_calls()] == ["call_b"]


async def test_deltas_are_appended_before_what_the_next_write_emits(engine: EngineHarness) -> None:
    engine.script([{"say": "unused"}])
    session_id = await engine.create_session()
    _, recorder = await engine.begin()
    message = await recorder.open_message()
    recorder.add_delta({"type": "test.delta", "session_id": session_id})
    assert recorder.has_deltas
    await recorder.abandon_message(message)
    assert not recorder.has_deltas
    types = [e["type"] for e in await engine.events(session_id)]
    assert types[-4:] == [
        "agent.session.turn.item.added", "agent.session.turn.content_part.added", "test.delta", "agent.session.turn.item.done",
    ]
    assert (await engine.items(session_id))[-1].status == "incomplete"


async def test_no_write_reaches_the_database_once_the_lease_is_lost(engine: EngineHarness) -> None:
    engine.script([{"say": "unused"}])
    session_id = await engine.create_session()
    start, recorder = await engine.begin()
    async with engine.runtime.db.write() as conn:
        await conn.execute(sa.update(turns).values(lease_token=turns.c.lease_token + 1))
    before = await engine.events(session_id)
    recorder.add_delta({"type": "test.delta", "session_id": session_id})
    with pytest.raises(LeaseLostError):
        await recorder.open_message()
    response = ModelResponse(text="late", tool_calls=(ToolCall("call_a", "lookup", {}),))
    with pytest.raises(LeaseLostError):
        await recorder.record_step(None, response, [_CLIENT], None)
    assert await engine.events(session_id) == before
    assert [i.type for i in await engine.items(session_id)] == ["message"]
    assert (await engine.turn(start.turn.id)).step == 0

