"""The agent loop on a real SQLite database: how a step's calls and results are recorded."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import sqlalchemy as sa

from cairn.engine.runtime import Runtime
from cairn.engine.sessions import SessionService
from cairn.engine.turn import TurnRunner
from cairn.models.base import Model, ModelEvent, ModelRequest, ModelResponse, ToolCall
from cairn.store.items import session_items
from cairn.store.jobs import claim_job
from cairn.store.tables import turns
from cairn.store.turns import get_turn

pytestmark = pytest.mark.anyio

NOTE = "a small note\n"
# The workspace is made, with its inline files, by the worker that first runs a turn.
NOTE_ENVIRONMENT = {
    "type": "openai_hosted",
    "files": [{"type": "inline", "data": base64.b64encode(NOTE.encode()).decode(), "path": "/workspace/note.txt"}],
}


def _read(path: str) -> dict[str, Any]:
    return {"call": "read_file", "arguments": {"path": path}}


async def _run_turn(runtime: Runtime, steps: list[dict[str, Any]]) -> tuple[str, list[list[dict[str, Any]]]]:
    """Run one scripted turn to its end; returns the session id and its events, one list per
    committed transaction."""
    assert runtime.settings.scripts_dir is not None
    (runtime.settings.scripts_dir / "test.json").write_text(json.dumps({"turns": [steps]}))
    service = SessionService(runtime)
    message = {"role": "user", "content": [{"type": "input_text", "text": "go"}]}
    created = await service.create(
        "t1", {"agent": {"model": "scripted:test"}, "environment": NOTE_ENVIRONMENT, "input": [message]}
    )
    session_id = created.session.id
    job = await claim_job(runtime.db, owner="test", lease_s=300)
    assert job is not None
    with runtime.notifier.subscribe(session_id) as subscription:
        await TurnRunner(runtime).run(job)
        published, overflowed = subscription.take()
    assert not overflowed
    return session_id, [[json.loads(r.data) for r in p.records] for p in published]


def _call_events(batch: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    """(event type, item type, item status) of the item events about calls and their outputs."""
    return [
        (e["type"].rsplit(".", 1)[-1], e["item"]["type"], e["item"].get("status"))
        for e in batch
        if "item" in e and e["item"]["type"].startswith("function_call")
    ]


async def test_a_step_that_only_reads_is_recorded_with_its_results_in_one_transaction(runtime: Runtime) -> None:
    session_id, batches = await _run_turn(runtime, [{"calls": [_read("note.txt"), _read("missing.txt")]}, {"say": "done"}])
    step = [b for b in batches if _call_events(b)]
    # One transaction, and the same events as for calls run after their record.
    assert [_call_events(b) for b in step] == [[
        ("added", "function_call", "in_progress"),
        ("added", "function_call", "in_progress"),
        ("done", "function_call", "completed"),
        ("added", "function_call_output", "completed"),
        ("done", "function_call", "failed"),
        ("added", "function_call_output", "failed"),
    ]]
    async with runtime.db.read() as conn:
        items = [i for i in await session_items(conn, session_id) if i.type.startswith("function_call")]
        turn = await get_turn(conn, items[0].turn_id)
    assert [(i.type, i.status) for i in items] == [
        ("function_call", "completed"), ("function_call", "failed"),
        ("function_call_output", "completed"), ("function_call_output", "failed"),
    ]
    assert items[2].data["output"] == NOTE and "no such file" in items[3].data["error"]
    assert turn is not None and turn.status == "completed" and turn.step == 2


async def test_a_step_that_may_change_files_records_its_calls_before_running_them(runtime: Runtime) -> None:
    write = {"call": "write_file", "arguments": {"path": "new.txt", "content": "new\n"}}
    session_id, batches = await _run_turn(runtime, [{"calls": [_read("note.txt"), write]}, {"say": "done"}])
    step = [_call_events(b) for b in batches if _call_events(b)]
    assert step == [
        [("added", "function_call", "in_progress"), ("added", "function_call", "in_progress")],
        [("done", "function_call", "completed"), ("added", "function_call_output", "completed")],
        [("done", "function_call", "completed"), ("added", "function_call_output", "completed")],
    ]
    assert (runtime.environments.workspace_of(session_id) / "new.txt").read_text() == "new\n"


async def test_a_read_that_fails_unexpectedly_leaves_its_call_on_record(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_args: Any) -> str:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("cairn.engine.turn.run_file_tool", broken)
    session_id, _ = await _run_turn(runtime, [{"call": "read_file", "arguments": {"path": "note.txt"}}, {"say": "done"}])
    async with runtime.db.read() as conn:
        items = await session_items(conn, session_id)
        turn = await get_turn(conn, items[-1].turn_id)
    assert [(i.type, i.status) for i in items if i.type == "function_call"] == [("function_call", "incomplete")]
    assert turn is not None and turn.status == "failed" and turn.step == 1


class _LeaseTakenModel(Model):
    """Asks for a read, after another worker took the turn over (as a new claim of its job would)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        async with self.runtime.db.write() as conn:
            await conn.execute(sa.update(turns).where(turns.c.id == request.turn_id).values(lease_token=turns.c.lease_token + 1))
        yield ModelResponse(text=None, tool_calls=(ToolCall("call_1", "read_file", {"path": "note.txt"}),))


async def test_a_step_is_not_recorded_once_the_lease_is_lost(runtime: Runtime) -> None:
    resolve: Callable[[str], Model] = lambda _name: _LeaseTakenModel(runtime)  # noqa: E731
    session_id, batches = await _run_turn(dataclasses.replace(runtime, resolve_model=resolve), [{"say": "unused"}])
    async with runtime.db.read() as conn:
        items = await session_items(conn, session_id)
        turn = await get_turn(conn, items[0].turn_id)
    assert [i.type for i in items] == ["message"]  # the user's input, nothing of the step
    assert turn is not None and turn.status == "in_progress" and turn.step == 0
    assert not any(_call_events(b) for b in batches)
