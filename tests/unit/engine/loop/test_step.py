"""A step: the model's response recorded, and its calls through the pipeline, run ahead of
their record when they only read."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cairn.engine.loop.step import Step
from cairn.engine.tools import Toolbox, ToolPolicies, build_pipeline
from cairn.errors import ModelError
from cairn.models.base import Model, ModelEvent, ModelRequest, TextDelta
from tests.unit.engine.harness import EngineHarness, PathGate, call_events

pytestmark = pytest.mark.anyio

NOTE = "a small note\n"


def _read(path: str) -> dict[str, object]:
    return {"call": "read_file", "arguments": {"path": path}}


async def test_a_step_that_only_reads_is_recorded_with_its_results_in_one_transaction(engine: EngineHarness) -> None:
    engine.script([{"calls": [_read("note.txt"), _read("missing.txt")]}, {"say": "done"}])
    session_id = await engine.create_session(files={"note.txt": NOTE})
    batches = await engine.run_job()
    step = [b for b in batches if call_events(b)]
    # One transaction, and the same events as for calls run after their record.
    assert [call_events(b) for b in step] == [[
        ("added", "function_call", "in_progress"),
        ("added", "function_call", "in_progress"),
        ("done", "function_call", "completed"),
        ("added", "function_call_output", "completed"),
        ("done", "function_call", "failed"),
        ("added", "function_call_output", "failed"),
    ]]
    items = [i for i in await engine.items(session_id) if i.type.startswith("function_call")]
    assert [(i.type, i.status) for i in items] == [
        ("function_call", "completed"), ("function_call", "failed"),
        ("function_call_output", "completed"), ("function_call_output", "failed"),
    ]
    assert items[2].data["output"] == NOTE and "no such file" in items[3].data["error"]
    turn = await engine.turn(items[0].turn_id)
    assert turn.status == "completed" and turn.step == 2


async def test_a_step_that_may_change_files_records_its_calls_before_running_them(engine: EngineHarness) -> None:
    write = {"call": "write_file", "arguments": {"path": "new.txt", "content": "new\n"}}
    engine.script([{"calls": [_read("note.txt"), write]}, {"say": "done"}])
    session_id = await engine.create_session(files={"note.txt": NOTE})
    batches = await engine.run_job()
    assert [call_events(b) for b in batches if call_events(b)] == [
        [("added", "function_call", "in_progress"), ("added", "function_call", "in_progress")],
        [("done", "function_call", "completed"), ("added", "function_call_output", "completed")],
        [("done", "function_call", "completed"), ("added", "function_call_output", "completed")],
    ]
    assert (engine.workspace(session_id) / "new.txt").read_text() == "new\n"


async def test_a_command_streams_its_output_before_its_item_is_done(engine: EngineHarness) -> None:
    engine.sandbox.replies["ls"] = ([b"a\n", b"b\n"], 0)
    engine.script([{"call": "shell", "arguments": {"command": "ls"}}, {"say": "done"}])
    session_id = await engine.create_session()
    await engine.run_job()
    events = await engine.events(session_id)
    deltas = [i for i, e in enumerate(events) if e["type"] == "agent.output.command_execution_output.delta"]
    done = next(i for i, e in enumerate(events) if e["type"].endswith("item.done") and e["item"]["type"] == "command_execution")
    assert "".join(events[i]["delta"] for i in deltas) == "a\nb\n" and max(deltas) < done
    assert events[done]["item"] | {"id": None, "turn_id": None} == {
        "id": None, "turn_id": None, "type": "command_execution", "status": "completed", "command": "ls", "cwd": "/workspace",
        "output": "a\nb\n", "exit_code": 0, "duration_ms": 2, "arguments": '{"command": "ls"}',
    }


async def test_a_call_held_in_a_step_run_ahead_stays_open_and_the_others_are_stored_finished(engine: EngineHarness) -> None:
    engine.script([{"calls": [_read("other.txt"), _read("note.txt")]}])
    await engine.create_session(files={"note.txt": NOTE, "other.txt": "other"})
    await engine.restart(ToolPolicies(gate=PathGate("note.txt")))
    start, recorder = await engine.begin()
    outcome = await Step.of_turn(engine.runtime, start, recorder).run()
    assert outcome.has_calls and [h.action_kind for h in outcome.holds] == ["test_gate_hold"]
    items = [i for i in await engine.items(start.session.id) if i.type.startswith("function_call")]
    assert [(i.type, i.status, i.call_id) for i in items] == [
        ("function_call", "completed", items[0].call_id),
        ("function_call", "in_progress", outcome.holds[0].call_id),
        ("function_call_output", "completed", items[0].call_id),
    ]
    assert recorder.open_calls() == [items[1]]
    assert (await engine.turn(start.turn.id)).step == 1


class _FailsAfterText(Model):
    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        yield TextDelta("partial ")
        raise ModelError("the provider refused", code="invalid_prompt", retryable=False)


async def test_a_model_failure_closes_the_message_it_streamed_into(engine: EngineHarness) -> None:
    engine.script([{"say": "unused"}])
    session_id = await engine.create_session()
    start, recorder = await engine.begin()
    step = Step(recorder, _FailsAfterText(), Toolbox([]), build_pipeline(ToolPolicies(), recorder))
    with pytest.raises(ModelError, match="refused"):
        await step.run()
    message = (await engine.items(session_id))[-1]
    assert (message.type, message.status, message.data["role"]) == ("message", "incomplete", "assistant")
    deltas = [e["delta"] for e in await engine.events(session_id) if e["type"].endswith("output_text.delta")]
    assert deltas == ["partial "]
    assert (await engine.turn(start.turn.id)).step == 0
