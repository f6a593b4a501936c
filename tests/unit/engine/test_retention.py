"""Lifetimes of what is sealed at rest (docs/security.md, "Lifetimes"): an approval's state is
kept as long as its status allows, then cleared with its data key shredded; deleting a session
takes its approvals' states and its ledger results; the sweep deletes data keys whose record
is gone; nothing that is still needed is touched."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import sqlalchemy as sa

from cairn.durable.crypto import SealScope
from cairn.engine.approvals import Decision, DecisionRequest, decide, expire_approvals, show_approval
from cairn.engine.retention import sweep_sealed_state
from cairn.engine.sessions import SessionService
from cairn.store.approvals import get_approval
from cairn.store.tables import approvals as approvals_table
from cairn.store.tables import data_keys, ledger_entries
from tests.unit.engine.approvals.approval_harness import (
    approvals,
    approve,
    key,
    open_gated,
    pinned_session,
    release_agents,
    write,
)
from tests.unit.engine.harness import EngineHarness
from tests.unit.engine.ledger.ledger_harness import Deployer, call, entry, open_ledger, start_deploy

pytestmark = pytest.mark.anyio

_LONG = 3600.0


async def _keys(engine: EngineHarness, kind: str) -> list[str]:
    async with engine.runtime.db.read() as conn:
        return [str(r) for r in (await conn.execute(sa.select(data_keys.c.record_id).where(data_keys.c.kind == kind))).scalars()]


async def _context_key(engine: EngineHarness, turn_id: str) -> None:
    """A data key for a turn's persisted context, as `cairn.engine.loop.run_context` stores one."""
    async with engine.runtime.db.write() as conn:
        await engine.runtime.sealer.seal(conn, b"{}", SealScope("t1", "run_context", turn_id))


async def _sweep(engine: EngineHarness, **ttls: float) -> tuple[int, int]:
    """One sweep with these run-state TTLs (`pending`, `rejected`, …; the others long)."""
    settings = dataclasses.replace(engine.settings, **{f"run_state_ttl_{s}_s": ttls.get(s, _LONG)
                                                      for s in ("pending", "rejected", "completed", "expired")})
    report = await sweep_sealed_state(dataclasses.replace(engine.runtime, settings=settings))
    return report.states_deleted, report.orphaned_keys_deleted


async def _shown(engine: EngineHarness, approval_id: str) -> dict[str, Any]:
    async with engine.runtime.db.read() as conn:
        found = await get_approval(conn, approval_id)
        assert found is not None
        return await show_approval(engine.runtime.sealer, conn, found)


async def test_each_status_keeps_the_state_its_time_to_live_then_it_is_deleted_with_its_data_key(engine: EngineHarness) -> None:
    engine.script([{"calls": [write(p) for p in ("rejected.txt", "completed.txt", "expired.txt", "pending.txt")]}, {"say": "ok"}])
    await open_gated(engine, release_agents())
    session_id = await pinned_session(engine)
    await engine.run_job()
    rejected, completed, expired, pending = await approvals(engine, session_id)
    approver = await key(engine)
    await decide(engine.runtime.journal, approver, rejected.id, DecisionRequest(Decision.REJECT, message="no"))
    await approve(engine, approver, completed)
    async with engine.runtime.db.write() as conn:
        await conn.execute(sa.update(approvals_table).where(approvals_table.c.id == expired.id).values(expires_at=approvals_table.c.created_at))
    assert await expire_approvals(engine.runtime.journal) == 1
    await engine.run_job()  # the approved call runs; the turn waits for the pending one
    assert (await _shown(engine, completed.id))["started_at"] is not None
    assert sorted(await _keys(engine, "approval")) == sorted(a.id for a in (rejected, completed, expired, pending))

    assert await _sweep(engine) == (0, 0)  # every state within its time to live
    for status, approval in (("rejected", rejected), ("completed", completed), ("expired", expired)):
        assert await _sweep(engine, **{status: 0}) == (1, 0), status
        shown = await _shown(engine, approval.id)
        assert (shown["state"], shown["review"], shown["summary"]) == ("deleted", None, None)
        assert approval.id not in await _keys(engine, "approval")
        async with engine.runtime.db.read() as conn:
            row = (await conn.execute(sa.select(approvals_table).where(approvals_table.c.id == approval.id))).one()
        assert (row.sealed_state, row.run_state, row.review, row.summary) == (None, None, None, None)
        assert row.state_deleted_at is not None and row.status == shown["status"]  # the decision stays on record
    # A pending state is still needed: its expiry bounds it, never the sweep.
    assert await _sweep(engine, rejected=0, completed=0, expired=0, pending=0) == (0, 0)
    assert (await _shown(engine, pending.id))["state"] == "sealed" and await _keys(engine, "approval") == [pending.id]


async def test_a_pending_state_expires_by_its_time_to_live_at_most(engine: EngineHarness) -> None:
    engine.settings = dataclasses.replace(engine.settings, run_state_ttl_pending_s=60.0)
    engine.script([{"calls": [write("a.txt")]}, {"say": "ok"}])
    await open_gated(engine, release_agents(ttl_s=86400))
    session_id = await pinned_session(engine)
    await engine.run_job()
    [held] = await approvals(engine, session_id)
    assert held.expires_at - held.created_at == pytest.approx(60.0)


async def test_deleting_a_session_deletes_its_approval_states_and_ledger_results_with_their_keys(engine: EngineHarness) -> None:
    deployer = Deployer()
    await open_ledger(engine, deployer)
    shipped = await start_deploy(engine, "deploy_release")
    await engine.run_job()
    result = await entry(engine)
    assert result.result == {"output": "deployed:r-1"} and await _keys(engine, "tool_result") == [result.operation_key]

    engine.script([{"calls": [write("a.txt")]}, {"say": "ok"}])
    await open_gated(engine, release_agents())
    held_session = await pinned_session(engine)
    await engine.run_job()
    [held] = await approvals(engine, held_session)
    kept_keys = await _keys(engine, "approval")
    await _context_key(engine, held.turn_id)  # as a turn that keeps a persisted context has

    service = SessionService(engine.runtime)
    await service.delete("t1", shipped)
    assert await _keys(engine, "tool_result") == []
    async with engine.runtime.db.read() as conn:
        row = (await conn.execute(sa.select(ledger_entries).where(ledger_entries.c.operation_key == result.operation_key))).one()
    assert (row.result, row.result_blob, row.status) == (None, None, "succeeded")  # the record of what ran stays
    assert await _keys(engine, "approval") == kept_keys  # another session's state is untouched

    await service.delete("t1", held_session)
    shown = await _shown(engine, held.id)
    assert (shown["status"], shown["reason"], shown["state"]) == ("revoked", "session_deleted", "deleted")
    assert await _keys(engine, "approval") == [] and await _keys(engine, "run_context") == []


async def test_the_sweep_deletes_data_keys_whose_record_is_gone_and_nothing_else(engine: EngineHarness) -> None:
    deployer = Deployer()
    await open_ledger(engine, deployer)
    engine.script([{"calls": [call("deploy_release", release="r-1"), call("deploy_release", release="r-2")]}, {"say": "ok"}])
    await engine.create_session(agent_id="release-agent")
    await engine.run_job()
    results = sorted(await _keys(engine, "tool_result"))
    assert len(results) == 2
    engine.script([{"calls": [write("a.txt")]}, {"say": "ok"}])
    await open_gated(engine, release_agents())
    session_id = await pinned_session(engine)
    await engine.run_job()
    [held] = await approvals(engine, session_id)

    # What a crash or a hand-made deletion could leave: records gone, their keys not.
    async with engine.runtime.db.write() as conn:
        await conn.execute(sa.delete(ledger_entries).where(ledger_entries.c.operation_key == results[0]))
    await _context_key(engine, "turn_gone")
    await _context_key(engine, held.turn_id)  # its turn is there, but keeps no context
    assert await _sweep(engine) == (0, 3)
    assert await _keys(engine, "tool_result") == [results[1]] and await _keys(engine, "approval") == [held.id]
    assert (await _shown(engine, held.id))["state"] == "sealed"
    assert await _sweep(engine) == (0, 0)
