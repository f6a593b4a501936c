"""Approval rows on SQLite and PostgreSQL: the transition table walked move by move, one
approval per call, every decision a compare-and-set (two at once: one wins), expiry and the
start of an approved call decided by the same conditional write, and open approvals closed
with their turn."""

from __future__ import annotations

import itertools

import anyio
import pytest
import sqlalchemy as sa

from cairn.errors import IllegalTransitionError, StatusConflictError
from cairn.ids import new_approval_id, new_session_id, new_turn_id
from cairn.states import APPROVAL_TRANSITIONS, ApprovalReason, ApprovalStatus
from cairn.store.approvals import (
    ApprovalRecord,
    Decider,
    close_approvals,
    due_for_expiry,
    get_approval,
    insert_approval,
    list_approvals,
    mark_started,
    transition_approval,
)
from cairn.store.db import Database
from cairn.store.tables import approvals
from tests.lock_waits import LockWaits

pytestmark = pytest.mark.anyio

_APPROVER = Decider(key_id="key_1", tenant="t1", role="approver")


def _record(session_id: str, turn_id: str, call_id: str = "call_1", tool: str = "deploy") -> ApprovalRecord:
    return ApprovalRecord(
        id=new_approval_id(), tenant="t1", session_id=session_id, turn_id=turn_id, call_id=call_id, tool_name=tool,
        review={"release": "r-1"}, summary="deploy(release='r-1')", arguments_digest="a" * 64, agent_version="agent/v1",
        agent_revision="rev", approvers=["approver"], run_state={"call_id": call_id}, run_state_version=1,
        status=ApprovalStatus.PENDING, reason=None, message=None, created_at=0.0, expires_at=0.0,
    )


async def _new(db: Database, *, ttl_s: float = 3600, session_id: str | None = None, turn_id: str | None = None,
               call_id: str = "call_1") -> ApprovalRecord:
    async with db.write() as conn:
        return await insert_approval(conn, _record(session_id or new_session_id(), turn_id or new_turn_id(), call_id), ttl_s=ttl_s)


async def _read(db: Database, approval_id: str) -> ApprovalRecord:
    async with db.read() as conn:
        found = await get_approval(conn, approval_id)
    assert found is not None
    return found


async def test_approval_moves_follow_the_table(db: Database) -> None:
    for from_, to in itertools.product(ApprovalStatus, repeat=2):
        created = await _new(db)
        async with db.write() as conn:
            await conn.execute(sa.update(approvals).where(approvals.c.id == created.id).values(status=from_))
        row = await _read(db, created.id)
        if APPROVAL_TRANSITIONS.is_allowed(from_, to):
            async with db.write() as conn:
                moved = await transition_approval(conn, row, to, reason="r", decider=_APPROVER)
            assert moved.status == to and moved.decided_by == "key_1" and await _read(db, row.id) == moved
            continue
        with pytest.raises(IllegalTransitionError):
            async with db.write() as conn:
                await transition_approval(conn, row, to)
        assert await _read(db, row.id) == row


async def test_a_call_has_one_approval_however_often_it_is_held(db: Database) -> None:
    first = await _new(db)
    again = await _new(db, session_id=first.session_id, turn_id=first.turn_id)
    assert again == first and first.expires_at - first.created_at == pytest.approx(3600)
    async with db.read() as conn:
        page = await list_approvals(conn, "t1", session_id=first.session_id, after=None, order="desc", limit=10)
        other_tenant = await list_approvals(conn, "t2", after=None, order="desc", limit=10)
        assert await get_approval(conn, first.id, tenant="t2") is None
    assert page.data == [first] and other_tenant.data == []


async def test_two_decisions_at_once_exactly_one_wins(db: Database) -> None:
    """Both deciders read the approval pending; the first to write holds its transaction open
    until the second waits for it, then commits; the second loses and writes nothing."""
    approval = await _new(db)
    first_wrote = anyio.Event()
    outcomes: dict[ApprovalStatus, str] = {}

    async def decider(to: ApprovalStatus, waits: LockWaits) -> None:
        try:
            if to == ApprovalStatus.REJECTED:
                await first_wrote.wait()
            async with db.write() as conn:
                await transition_approval(conn, approval, to, decider=_APPROVER, message=str(to), unexpired=True)
                if to == ApprovalStatus.APPROVED:
                    first_wrote.set()
                    await waits.until_another_waits(db, "the rejecting decider to wait for the lock")
            outcomes[to] = "won"
        except StatusConflictError:
            outcomes[to] = "lost"

    with LockWaits() as waits:
        async with anyio.create_task_group() as tg:
            tg.start_soon(decider, ApprovalStatus.REJECTED, waits)
            tg.start_soon(decider, ApprovalStatus.APPROVED, waits)
    assert outcomes == {ApprovalStatus.APPROVED: "won", ApprovalStatus.REJECTED: "lost"}
    stored = await _read(db, approval.id)
    assert (stored.status, stored.message) == (ApprovalStatus.APPROVED, "approved")


async def test_an_expired_approval_cannot_be_decided_and_is_due_for_expiry(db: Database) -> None:
    expired = await _new(db, ttl_s=0)
    live = await _new(db)
    with pytest.raises(StatusConflictError):
        async with db.write() as conn:
            await transition_approval(conn, expired, ApprovalStatus.APPROVED, decider=_APPROVER, unexpired=True)
    assert await _read(db, expired.id) == expired
    async with db.read() as conn:
        due = [a.id for a in await due_for_expiry(conn, limit=1000)]
    assert expired.id in due and live.id not in due


async def test_starting_an_approved_call_and_revoking_it_exclude_each_other(db: Database) -> None:
    approval = await _new(db)
    async with db.write() as conn:
        approved = await transition_approval(conn, approval, ApprovalStatus.APPROVED, decider=_APPROVER, unexpired=True)
        started = await mark_started(conn, approved)
    assert started is not None and started.is_started
    with pytest.raises(StatusConflictError):
        async with db.write() as conn:
            await transition_approval(conn, approved, ApprovalStatus.REVOKED, unstarted=True)
    async with db.write() as conn:
        assert await mark_started(conn, approved) is None  # started once only

    other = await _new(db)
    async with db.write() as conn:
        approved = await transition_approval(conn, other, ApprovalStatus.APPROVED, decider=_APPROVER)
        await transition_approval(conn, approved, ApprovalStatus.REVOKED, reason=ApprovalReason.REVOKED, unstarted=True)
        assert await mark_started(conn, approved) is None


async def test_closing_a_turn_revokes_what_can_no_longer_run_and_keeps_what_started(db: Database) -> None:
    session_id, turn_id = new_session_id(), new_turn_id()
    pending, approved, started, rejected = [await _new(db, session_id=session_id, turn_id=turn_id, call_id=f"c{i}") for i in range(4)]
    async with db.write() as conn:
        await transition_approval(conn, approved, ApprovalStatus.APPROVED, decider=_APPROVER)
        done = await transition_approval(conn, started, ApprovalStatus.APPROVED, decider=_APPROVER)
        await mark_started(conn, done)
        await transition_approval(conn, rejected, ApprovalStatus.REJECTED, decider=_APPROVER)
        closed = await close_approvals(conn, ApprovalReason.SESSION_CANCELLED, turn_id=turn_id)
    assert sorted(a.id for a in closed) == sorted([pending.id, approved.id])
    assert {(a.status, a.reason) for a in closed} == {(ApprovalStatus.REVOKED, ApprovalReason.SESSION_CANCELLED)}
    assert (await _read(db, started.id)).status == ApprovalStatus.APPROVED
    assert (await _read(db, rejected.id)).status == ApprovalStatus.REJECTED
