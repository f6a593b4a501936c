"""The approvals gate in the loop: a held call runs nothing until it is approved, runs exactly
once after, in a restarted process, and never when a check at execution time fails."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import sqlalchemy as sa

from cairn.engine.approvals import Decision, DecisionRequest, decide, expire_approvals
from cairn.engine.approvals.sealed import seal_state
from cairn.engine.sessions import SessionService
from cairn.engine.tools import workspace as workspace_tools
from cairn.errors import ConflictError, NotFoundError, PermissionDeniedError
from cairn.models.base import FunctionCallOutputInput, Model, ModelRequest
from cairn.models.registry import resolve_model
from cairn.operator import LoadedAgents
from cairn.store.approvals import ApprovalRecord
from cairn.store.keys import revoke_key, set_role
from cairn.store.tables import approvals as approvals_table
from cairn.store.tables import items as items_table
from tests.unit.engine.approvals.approval_harness import (
    approval_of,
    approvals,
    approve,
    call_result,
    key,
    open_gated,
    pinned_session,
    release_agents,
    write,
)
from tests.unit.engine.harness import EngineHarness
from tests.waits import until

pytestmark = pytest.mark.anyio



async def _held(engine: EngineHarness, *paths: str, **agent: Any) -> tuple[str, list[ApprovalRecord]]:
    """A pinned session whose first step writes `paths`, run until it waits for their approvals."""
    engine.script([{"calls": [write(p) for p in paths]}, {"say": "done"}])
    await open_gated(engine, release_agents(**agent))
    session_id = await pinned_session(engine)
    await engine.run_job()
    return session_id, await approvals(engine, session_id)


async def test_invariant_2_a_held_call_has_no_side_effect_and_shows_an_mcp_approval_request(
    engine: EngineHarness, executed: list[str]
) -> None:
    session_id, [approval] = await _held(engine, "deploy.txt")
    assert executed == [] and not (engine.workspace(session_id) / "deploy.txt").exists()
    turn = await engine.turn(approval.turn_id)
    assert turn.status == "waiting" and turn.lease_token is None
    assert (await engine.session(session_id)).status == "requires_action"
    assert await engine.required_actions(session_id) == [
        {
            "type": "mcp_approval_request",
            "request_id": approval.id,
            "request": {
                "type": "mcp_tool_call",
                "server_label": "release-agent",
                "name": "write_file",
                "arguments": {"path": "deploy.txt"},
                "message": "write_file(path='deploy.txt')",
            },
            "turn_id": turn.id,
        }
    ]
    assert approval.status == "pending" and approval.approvers == ["admin", "approver"]
    assert approval.run_state is not None and approval.run_state["call_id"] == approval.call_id
    assert approval.run_state_version == 2
    assert len(approval.arguments_digest) == 64
    # A restarted process asked again holds the same call for the same approval.
    await open_gated(engine, release_agents())
    assert not await engine.has_job()
    assert await approvals(engine, session_id) == [approval]


async def test_approved_in_another_process_it_runs_exactly_once_with_the_approval_in_its_context(
    engine: EngineHarness, executed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id, [approval] = await _held(engine, "deploy.txt")
    await open_gated(engine, release_agents())
    decided = await approve(engine, await key(engine), approval)
    assert decided.status == "approved" and decided.decided_role == "approver"

    seen: list[Any] = []
    original = workspace_tools.FileTool.execute

    async def observe(self: Any, arguments: Any, ctx: Any) -> Any:
        seen.append(ctx.approval)
        return await original(self, arguments, ctx)

    monkeypatch.setattr(workspace_tools.FileTool, "execute", observe)
    await open_gated(engine, release_agents())
    await engine.run_job()
    assert executed == ["deploy.txt"]
    assert (engine.workspace(session_id) / "deploy.txt").read_text() == "deploy.txt\n"
    started = await approval_of(engine, approval.turn_id, approval.call_id)
    assert started.status == "approved" and started.is_started
    assert [(v.id, v.decided_by_key, v.decided_role, v.arguments_digest) for v in seen] == [
        (approval.id, decided.decided_by, "approver", approval.arguments_digest)
    ]
    turn = await engine.turn(approval.turn_id)
    assert turn.status == "completed"
    # Nothing runs it again: a second turn job or a revoke finds it started.
    with pytest.raises(ConflictError):
        await decide(engine.runtime.journal, await key(engine, "admin"), approval.id, DecisionRequest(Decision.REVOKE))
    assert executed == ["deploy.txt"]


async def test_a_rejection_reaches_the_model_as_the_calls_result(engine: EngineHarness, executed: list[str]) -> None:
    session_id, [approval] = await _held(engine, "deploy.txt")
    requests: list[ModelRequest] = []

    def recording(name: str) -> Model:
        model = resolve_model(name, settings=engine.settings)
        stream = model.stream

        def stream_recorded(request: ModelRequest) -> Any:
            requests.append(request)
            return stream(request)

        model.stream = stream_recorded  # type: ignore[method-assign]
        return model

    await engine.close()
    await engine.open(agents=release_agents(), resolve=recording)
    await decide(engine.runtime.journal, await key(engine), approval.id, DecisionRequest(Decision.REJECT, message="not on a Friday"))
    await engine.run_job()
    assert executed == []
    status, shown = await call_result(engine, session_id, approval.call_id)
    assert status == "failed" and "not on a Friday" in shown
    [next_request] = requests
    outputs = [e for e in next_request.input if isinstance(e, FunctionCallOutputInput)]
    assert outputs and "not on a Friday" in outputs[-1].output
    assert (await engine.turn(approval.turn_id)).status == "completed"


async def test_two_decisions_at_once_one_wins_and_the_other_changes_nothing(engine: EngineHarness) -> None:
    _, [approval] = await _held(engine, "deploy.txt")
    first, second = await key(engine), await key(engine, "admin")
    await approve(engine, first, approval)
    with pytest.raises(ConflictError) as refused:
        await decide(engine.runtime.journal, second, approval.id, DecisionRequest(Decision.REJECT, message="no"))
    assert refused.value.http_status == 409
    after = await approval_of(engine, approval.turn_id, approval.call_id)
    assert after.status == "approved" and after.decided_by == first.key_id and after.message is None


async def test_a_decision_needs_a_role_the_tool_names_and_the_digest_that_was_reviewed(engine: EngineHarness) -> None:
    _, [approval] = await _held(engine, "deploy.txt", approvers=frozenset({"approver"}))
    with pytest.raises(PermissionDeniedError):
        await approve(engine, await key(engine, "admin"), approval)
    with pytest.raises(PermissionDeniedError):
        await approve(engine, await key(engine, "member"), approval)
    wrong = DecisionRequest(Decision.APPROVE, arguments_digest="0" * 64)
    with pytest.raises(ConflictError) as refused:
        await decide(engine.runtime.journal, await key(engine), approval.id, wrong)
    assert refused.value.code == "digest_mismatch"
    assert await approval_of(engine, approval.turn_id, approval.call_id) == approval


async def _tamper(engine: EngineHarness, table: sa.Table, where: Any, **values: Any) -> None:
    async with engine.runtime.db.write() as conn:
        await conn.execute(sa.update(table).where(where).values(**values))


@pytest.mark.parametrize("change", ["arguments", "digest", "run_state", "key_revoked", "role_removed", "revision", "version_gone"])
async def test_invariant_4_a_check_at_execution_time_that_fails_runs_nothing(
    engine: EngineHarness, executed: list[str], change: str
) -> None:
    session_id, [approval] = await _held(engine, "deploy.txt")
    approver = await key(engine)
    await approve(engine, approver, approval)
    agents = release_agents()
    if change == "arguments":
        await _tamper(engine, items_table, items_table.c.call_id == approval.call_id,
                      data={"call_id": approval.call_id, "name": "write_file", "arguments": '{"path": "evil.txt", "content": "x"}'})
    elif change == "digest":
        await _tamper(engine, approvals_table, approvals_table.c.id == approval.id, arguments_digest="f" * 64)
    elif change == "run_state":
        # Only someone who holds the master key can seal another run state for the approval.
        assert approval.run_state is not None
        async with engine.runtime.db.write() as conn:
            forged = dataclasses.replace(approval, run_state={**approval.run_state, "call_id": "call_other"})
            sealed = await seal_state(engine.runtime.sealer, conn, forged)
            await conn.execute(sa.update(approvals_table).where(approvals_table.c.id == approval.id)
                               .values(sealed_state=sealed.sealed_state))
    elif change == "key_revoked":
        async with engine.runtime.db.write() as conn:
            assert await revoke_key(conn, approver.key_id)
    elif change == "role_removed":
        async with engine.runtime.db.write() as conn:
            assert await set_role(conn, approver.key_id, "member") is not None
    elif change == "revision":
        agents = release_agents(instructions="You ship releases, differently.")
    else:
        agents = LoadedAgents([])
    await open_gated(engine, agents)
    await engine.run_job()
    assert executed == [] and not (engine.workspace(session_id) / "deploy.txt").exists()
    expected = {
        "arguments": "digest_mismatch", "digest": "digest_mismatch", "run_state": "run_state_mismatch",
        "key_revoked": "approver_lost_rights", "role_removed": "approver_lost_rights",
        "revision": "migration_required", "version_gone": "migration_required",
    }[change]
    ended = await approval_of(engine, approval.turn_id, approval.call_id)
    assert (ended.status, ended.reason) == ("invalidated", expected)
    status, shown = await call_result(engine, session_id, approval.call_id)
    if change in ("revision", "version_gone"):
        # Without its pinned version the turn cannot go on at all: it fails before it starts.
        assert status == "incomplete" and (await engine.turn(approval.turn_id)).status == "failed"
    else:
        assert status == "failed" and shown.startswith("error: the call did not run")
        assert (await engine.turn(approval.turn_id)).status == "completed"


async def test_three_calls_of_one_step_decided_one_at_a_time(engine: EngineHarness, executed: list[str]) -> None:
    session_id, held = await _held(engine, "a.txt", "b.txt", "c.txt")
    assert len(held) == 3 and {a.call_id for a in held} == {i.call_id for i in await engine.items(session_id) if i.call_id}
    approver = await key(engine)
    first, second, third = held
    await approve(engine, approver, second)
    await engine.run_job()
    # The decided call ran; the others wait again, and the model was not asked.
    assert executed == ["b.txt"]
    assert [a["request_id"] for a in await engine.required_actions(session_id)] == [first.id, third.id]
    assert (await engine.turn(first.turn_id)).step == 1
    await decide(engine.runtime.journal, approver, third.id, DecisionRequest(Decision.REJECT, message="no c"))
    await engine.run_job()
    assert executed == ["b.txt"] and [a["request_id"] for a in await engine.required_actions(session_id)] == [first.id]
    await approve(engine, approver, first)
    await engine.run_job()
    assert executed == ["b.txt", "a.txt"]
    turn = await engine.turn(first.turn_id)
    assert turn.status == "completed" and turn.step == 2


async def test_an_approval_nobody_decides_expires_and_the_turn_goes_on(engine: EngineHarness, executed: list[str]) -> None:
    session_id, [approval] = await _held(engine, "deploy.txt", ttl_s=0.01)
    assert await until(lambda: expire_approvals(engine.runtime.journal), "the approval's time to run out") == 1
    with pytest.raises(ConflictError):
        await approve(engine, await key(engine), approval)
    await engine.run_job()
    ended = await approval_of(engine, approval.turn_id, approval.call_id)
    assert (ended.status, ended.reason) == ("expired", "expired") and executed == []
    assert "expired" in (await call_result(engine, session_id, approval.call_id))[1]
    assert (await engine.turn(approval.turn_id)).status == "completed"


async def test_revoked_after_approval_it_does_not_run(engine: EngineHarness, executed: list[str]) -> None:
    _, [approval] = await _held(engine, "deploy.txt")
    approver = await key(engine)
    await approve(engine, approver, approval)
    revoked = await decide(engine.runtime.journal, approver, approval.id, DecisionRequest(Decision.REVOKE, message="changed my mind"))
    assert (revoked.status, revoked.decided_by) == ("revoked", approver.key_id)
    await engine.run_job()
    assert executed == []
    assert (await engine.turn(approval.turn_id)).status == "completed"


async def test_cancel_and_delete_close_open_approvals_and_a_message_waits_for_the_decision(engine: EngineHarness) -> None:
    session_id, [approval] = await _held(engine, "deploy.txt")
    service = SessionService(engine.runtime)
    message = {"type": "agent.session.input.message", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}
    with pytest.raises(ConflictError) as refused:
        await service.submit("t1", session_id, [message], idempotency=None)
    assert refused.value.code == "awaiting_approval"
    await service.submit("t1", session_id, [{"type": "agent.session.input.cancel"}], idempotency=None)
    closed = await approval_of(engine, approval.turn_id, approval.call_id)
    assert (closed.status, closed.reason) == ("revoked", "session_cancelled")
    with pytest.raises(ConflictError):
        await approve(engine, await key(engine), approval)

    other_id, [other] = await _held(engine, "other.txt")
    await service.delete("t1", other_id)
    gone = await approval_of(engine, other.turn_id, other.call_id)
    assert (gone.status, gone.reason) == ("revoked", "session_deleted")


@pytest.mark.parametrize(("decision", "status", "reason"), [("approve", "approved", None), ("deny", "rejected", None),
                                                         ("cancel", "rejected", "dismissed")])
async def test_the_agents_api_input_event_decides_by_the_same_rules(
    engine: EngineHarness, executed: list[str], decision: str, status: str, reason: str | None
) -> None:
    session_id, [approval] = await _held(engine, "deploy.txt")
    event = {"type": "agent.session.input.mcp_approval_request_result", "request_id": approval.id,
             "response": {"type": "mcp_tool_call", "decision": decision}}
    service = SessionService(engine.runtime)
    with pytest.raises(PermissionDeniedError):
        await service.submit("t1", session_id, [event], idempotency=None, decider=await key(engine, "reader"))
    approver = await key(engine)
    await service.submit("t1", session_id, [event], idempotency=None, decider=approver)
    decided = await approval_of(engine, approval.turn_id, approval.call_id)
    assert (decided.status, decided.reason, decided.decided_by) == (status, reason, approver.key_id)
    with pytest.raises(ConflictError):
        await service.submit("t1", session_id, [event], idempotency=None, decider=approver)
    await engine.run_job()
    assert executed == (["deploy.txt"] if decision == "approve" else [])
    call_status, shown = await call_result(engine, session_id, approval.call_id)
    assert (call_status == "completed") == (decision == "approve") and shown  # the model sees the call's result


async def test_an_unknown_or_foreign_approval_is_not_found_and_nothing_changes(engine: EngineHarness) -> None:
    _, [approval] = await _held(engine, "deploy.txt")
    for decider, approval_id in ((await key(engine), "apr_unknown"), (await key(engine, tenant="t2"), approval.id)):
        with pytest.raises(NotFoundError):
            await decide(engine.runtime.journal, decider, approval_id, DecisionRequest(Decision.APPROVE))
    assert await approval_of(engine, approval.turn_id, approval.call_id) == approval


async def test_a_tool_whose_calls_never_need_approval_runs_without_one(engine: EngineHarness) -> None:
    engine.script([{"call": "read_file", "arguments": {"path": "notes.txt"}}, {"say": "done"}])
    await open_gated(engine, release_agents())
    session_id = await engine.create_session(agent_id="release-agent", files={"notes.txt": "hello\n"})
    await engine.run_job()
    assert await approvals(engine, session_id) == []
    assert (await engine.session(session_id)).status == "idle"


async def test_a_pending_state_that_no_longer_opens_fails_the_turn_when_it_is_asked_again(
    engine: EngineHarness, executed: list[str]
) -> None:
    session_id, [decided, pending] = await _held(engine, "a.txt", "b.txt")
    async with engine.runtime.db.write() as conn:
        blob = (await conn.execute(sa.select(approvals_table.c.sealed_state).where(approvals_table.c.id == pending.id))).scalar_one()
        await conn.execute(sa.update(approvals_table).where(approvals_table.c.id == pending.id).values(sealed_state=blob[:-1]))
    await approve(engine, await key(engine), decided)
    await engine.run_job()  # the decided call runs; asking the pending one again finds its state altered
    assert executed == ["a.txt"]
    ended = await approval_of(engine, pending.turn_id, pending.call_id)
    assert (ended.status, ended.reason) == ("invalidated", "state_deserialize_failure")
    turn = await engine.turn(pending.turn_id)
    assert turn.status == "failed" and turn.error is not None and turn.error["code"] == "state_deserialize_failure"
    assert f"approval {pending.id}" in turn.error["message"] and (await engine.session(session_id)).status == "idle"
