"""Session commands against a running turn: client results, cancels, and their races, on a real
SQLite database (required actions live in their own rows; a stale writer loses)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
import sqlalchemy as sa

from cairn.engine.loop import TurnRunner
from cairn.engine.runtime import Runtime
from cairn.engine.sessions import SessionService
from cairn.engine.wire import render_session
from cairn.errors import SandboxError
from cairn.snapshots import StartResult
from cairn.states import JobStatus, SessionStatus, TurnStatus
from cairn.store.events import read_events_after
from cairn.store.jobs import claim_job
from cairn.store.sessions import SessionRecord, get_session
from cairn.store.tables import jobs, required_actions
from cairn.store.turns import TurnRecord, get_turn

pytestmark = pytest.mark.anyio

LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
MESSAGE = {"role": "user", "content": [{"type": "input_text", "text": "go"}]}


async def _start(runtime: Runtime, steps: list[dict[str, Any]], *, environment: str = "none") -> tuple[SessionService, str, str]:
    """A session whose first turn runs `steps` (scripted) until it ends or waits; returns the
    service, the session id and the turn id."""
    assert runtime.settings.scripts_dir is not None
    (runtime.settings.scripts_dir / "test.json").write_text(json.dumps({"turns": [steps]}))
    service = SessionService(runtime)
    created = await service.create(
        "t1", {"agent": {"model": "scripted:test", "tools": [LOOKUP]}, "environment": {"type": environment}, "input": [MESSAGE]}
    )
    assert created.turn_id is not None
    return service, created.session.id, created.turn_id


async def _run_next_job(runtime: Runtime) -> None:
    job = await claim_job(runtime.db, owner="test", lease_s=300)
    assert job is not None, "no job was queued"
    await TurnRunner(runtime).run(job)


async def _state(runtime: Runtime, session_id: str, turn_id: str) -> tuple[SessionRecord, TurnRecord]:
    async with runtime.db.read() as conn:
        session = await get_session(conn, session_id)
        turn = await get_turn(conn, turn_id)
    assert session is not None and turn is not None
    return session, turn


async def _event_types(runtime: Runtime, session_id: str) -> list[str]:
    async with runtime.db.read() as conn:
        return [r.type for r in await read_events_after(conn, session_id, 0, limit=1000)]


async def _answer(service: SessionService, session_id: str, turn_id: str, call_id: str) -> None:
    event = {"type": "agent.session.input.tool_result", "turn_id": turn_id, "call_id": call_id, "success": True, "output": "42"}
    await service.submit("t1", session_id, [event], idempotency=None)


def _lookups(*queries: str) -> dict[str, Any]:
    return {"calls": [{"call": "lookup", "arguments": {"q": q}} for q in queries]}


async def test_client_results_resolve_their_required_actions_one_by_one(runtime: Runtime) -> None:
    service, session_id, turn_id = await _start(runtime, [_lookups("a", "b"), {"say": "done"}])
    await _run_next_job(runtime)
    session, turn = await _state(runtime, session_id, turn_id)
    assert (session.status, turn.status) == (SessionStatus.REQUIRES_ACTION, TurnStatus.WAITING)
    actions = render_session(session)["required_actions"]
    assert [(a["type"], a["name"], json.loads(a["arguments"]), a["turn_id"]) for a in actions] == [
        ("function_call", "lookup", {"q": "a"}, turn_id), ("function_call", "lookup", {"q": "b"}, turn_id)
    ]

    await _answer(service, session_id, turn_id, actions[0]["call_id"])
    session, turn = await _state(runtime, session_id, turn_id)
    assert (session.status, turn.status) == (SessionStatus.REQUIRES_ACTION, TurnStatus.WAITING)
    assert [a.call_id for a in session.required_actions] == [actions[1]["call_id"]]

    await _answer(service, session_id, turn_id, actions[1]["call_id"])
    session, turn = await _state(runtime, session_id, turn_id)
    assert (session.status, turn.status, session.required_actions) == (SessionStatus.IN_PROGRESS, TurnStatus.IN_PROGRESS, ())
    await _run_next_job(runtime)
    session, turn = await _state(runtime, session_id, turn_id)
    assert (session.status, turn.status) == (SessionStatus.IDLE, TurnStatus.COMPLETED)


async def test_cancelling_a_waiting_turn_drops_its_required_actions(runtime: Runtime) -> None:
    service, session_id, turn_id = await _start(runtime, [_lookups("a"), {"say": "unused"}])
    await _run_next_job(runtime)
    await service.submit("t1", session_id, [{"type": "agent.session.input.cancel"}], idempotency=None)
    session, turn = await _state(runtime, session_id, turn_id)
    assert (session.status, turn.status, session.required_actions) == (SessionStatus.IDLE, TurnStatus.CANCELLED, ())
    async with runtime.db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(required_actions))).scalar_one() == 0


async def test_a_turn_cancelled_while_its_workspace_is_prepared_stays_cancelled(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker read the queued turn, then failed to prepare its workspace; meanwhile the client
    cancelled the turn. The worker's `failed` must not overwrite `cancelled` (it used to, and the
    log showed the turn end twice)."""
    service, session_id, turn_id = await _start(runtime, [{"say": "unused"}], environment="openai_hosted")

    async def cancel_then_fail(tenant: str, session_id: str, environment: Mapping[str, Any]) -> StartResult | None:
        await service.submit(tenant, session_id, [{"type": "agent.session.input.cancel"}], idempotency=None)
        raise SandboxError("the disk is gone")

    monkeypatch.setattr(runtime.environments, "acquire", cancel_then_fail)
    await _run_next_job(runtime)
    session, turn = await _state(runtime, session_id, turn_id)
    assert (session.status, turn.status, turn.error) == (SessionStatus.IDLE, TurnStatus.CANCELLED, None)
    turn_events = [t for t in await _event_types(runtime, session_id) if t.startswith("agent.session.turn.")]
    assert turn_events == ["agent.session.turn.created", "agent.session.turn.cancelled"]
    async with runtime.db.read() as conn:
        assert (await conn.execute(sa.select(jobs.c.status))).scalars().all() == [JobStatus.DONE]
