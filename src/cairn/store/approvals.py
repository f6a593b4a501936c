"""Approval rows: one per tool call held for a person's decision.

This module is the only writer of the `approvals` table. A row is inserted `pending` by the
gate that holds the call; its status then moves only through `transition_approval`, checked
against `cairn.states.APPROVAL_TRANSITIONS` before any SQL and conditional on the status its
writer read (design invariant 3: every decision is a compare-and-set from `pending`, and
the second one changes nothing). Time conditions (expiry) and the start of an approved
call are part of the same conditional UPDATE, on the database clock, so a decision racing
the expiry or a revocation racing the start has exactly one winner.

Rows carry references, never the call's content beyond what an approver is shown: the run
state names the call's item and the pinned agent, with its own schema version. The review,
summary and run state are stored sealed (`sealed_state`, sealed and opened by the engine's
`cairn.engine.approvals.sealed`); this module stores and clears the sealed bytes and never
sees them in clear, except in rows from before sealing (run state version 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from cairn.errors import InvalidRequestError, StatusConflictError
from cairn.states import APPROVAL_TRANSITIONS, ApprovalReason, ApprovalStatus
from cairn.store.db import Connection, database_clock
from cairn.store.pages import Order, Page, fetch_page
from cairn.store.tables import approvals

__all__ = [
    "ApprovalRecord",
    "Decider",
    "clear_states",
    "close_approvals",
    "database_time",
    "due_for_expiry",
    "get_approval",
    "get_call_approval",
    "insert_approval",
    "list_approvals",
    "mark_started",
    "session_approval_ids",
    "states_past_ttl",
    "transition_approval",
]


@dataclass(frozen=True, slots=True)
class Decider:
    """Who decides: an API key, with its tenant and role as they are at the decision."""

    key_id: str
    tenant: str
    role: str


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    id: str
    tenant: str
    session_id: str
    turn_id: str
    call_id: str
    tool_name: str
    # In clear once opened (`cairn.engine.approvals.sealed`); None (and `sealed_state` set)
    # as read from the store, and None for good once the state is deleted.
    review: Any
    summary: str | None
    arguments_digest: str
    agent_version: str
    agent_revision: str
    approvers: list[str]
    run_state: dict[str, Any] | None
    run_state_version: int
    status: ApprovalStatus
    reason: str | None
    message: str | None
    created_at: float
    expires_at: float
    decided_at: float | None = None
    started_at: float | None = None
    decided_by: str | None = None
    decided_tenant: str | None = None
    decided_role: str | None = None
    sealed_state: bytes | None = None
    state_deleted_at: float | None = None

    @property
    def is_started(self) -> bool:
        return self.started_at is not None


# The state's JSON columns, kept in clear only in rows of run state version 1.
_CLEAR_JSON = ("review", "run_state")


def _record(row: sa.Row[Any]) -> ApprovalRecord:
    values = row._asdict()
    values["status"] = ApprovalStatus(values["status"])
    return ApprovalRecord(**values)


def _clock(conn: Connection) -> sa.ColumnElement[float]:
    return database_clock(conn.dialect.name)


async def database_time(conn: Connection) -> float:
    """Now, on the database clock that expiry is measured by."""
    return float((await conn.execute(sa.select(_clock(conn)))).scalar_one())


async def insert_approval(conn: Connection, record: ApprovalRecord, *, ttl_s: float) -> ApprovalRecord:
    """Store a new pending approval created now and expiring `ttl_s` later (database clock);
    `record`'s times are ignored. The call's existing approval, if it has one, is returned
    instead: a call is held for one decision, however often the gate is asked."""
    APPROVAL_TRANSITIONS.check_initial(record.status)
    existing = await get_call_approval(conn, record.turn_id, record.call_id)
    if existing is not None:
        return existing
    now = await database_time(conn)
    values = {f: getattr(record, f) for f in ApprovalRecord.__slots__}
    values.update(created_at=now, expires_at=now + ttl_s)
    # A sealed row's clear JSON columns are SQL NULL, not JSON null.
    stored = {**values, **{f: sa.null() for f in _CLEAR_JSON if values[f] is None}}
    await conn.execute(sa.insert(approvals).values(**stored))
    return ApprovalRecord(**values)


async def get_approval(conn: Connection, approval_id: str, *, tenant: str | None = None) -> ApprovalRecord | None:
    """The approval, or None when it does not exist or belongs to another tenant."""
    stmt = sa.select(approvals).where(approvals.c.id == approval_id)
    if tenant is not None:
        stmt = stmt.where(approvals.c.tenant == tenant)
    row = (await conn.execute(stmt)).first()
    return _record(row) if row is not None else None


async def get_call_approval(conn: Connection, turn_id: str, call_id: str) -> ApprovalRecord | None:
    """The approval of one call of a turn, if it was ever held."""
    stmt = sa.select(approvals).where(approvals.c.turn_id == turn_id, approvals.c.call_id == call_id)
    row = (await conn.execute(stmt)).first()
    return _record(row) if row is not None else None


async def list_approvals(
    conn: Connection,
    tenant: str,
    *,
    status: ApprovalStatus | None = None,
    session_id: str | None = None,
    tool_name: str | None = None,
    after: str | None,
    order: Order,
    limit: int,
) -> Page[ApprovalRecord]:
    """A page of the tenant's approvals, newest first by default; the filters are part of the
    query, so a page is full unless it is the last."""
    stmt = sa.select(approvals).where(approvals.c.tenant == tenant)
    if status is not None:
        stmt = stmt.where(approvals.c.status == status)
    if session_id is not None:
        stmt = stmt.where(approvals.c.session_id == session_id)
    if tool_name is not None:
        stmt = stmt.where(approvals.c.tool_name == tool_name)
    after_key = None
    if after is not None:
        anchor = await get_approval(conn, after, tenant=tenant)
        if anchor is None:
            raise InvalidRequestError(f"unknown approval id in `after`: {after}", param="after")
        after_key = (anchor.created_at, anchor.id)
    page = await fetch_page(conn, stmt, (approvals.c.created_at, approvals.c.id), after=after_key, order=order, limit=limit)
    return Page([_record(r) for r in page.data], page.has_more)


async def transition_approval(
    conn: Connection,
    approval: ApprovalRecord,
    to: ApprovalStatus,
    *,
    reason: str | None = None,
    message: str | None = None,
    decider: Decider | None = None,
    unexpired: bool = False,
    unstarted: bool = False,
) -> ApprovalRecord:
    """Move `approval` from the status it was read in to `to`, only if the table allows the
    move (`IllegalTransitionError`, before any SQL) and the row is still in that status,
    still before its expiry when `unexpired`, and not yet started when `unstarted`
    (`StatusConflictError` otherwise: another writer or the clock got there first). A
    `decider` is recorded with the decision time."""
    APPROVAL_TRANSITIONS.check(approval.status, to)
    values: dict[str, Any] = {"status": to, "reason": reason, "message": message}
    if decider is not None:
        values.update(decided_at=_clock(conn), decided_by=decider.key_id, decided_tenant=decider.tenant,
                      decided_role=decider.role)
    elif approval.decided_at is None:
        values["decided_at"] = _clock(conn)
    stmt = sa.update(approvals).where(approvals.c.id == approval.id, approvals.c.status == approval.status)
    if unexpired:
        stmt = stmt.where(approvals.c.expires_at > _clock(conn))
    if unstarted:
        stmt = stmt.where(approvals.c.started_at.is_(None))
    row = (await conn.execute(stmt.values(**values).returning(approvals))).first()
    if row is None:
        raise StatusConflictError(f"approval {approval.id} is no longer {approval.status}; not moved to {to}")
    return _record(row)


async def mark_started(conn: Connection, approval: ApprovalRecord) -> ApprovalRecord | None:
    """An approved call is let through to run: from now on it cannot be revoked. None when it
    is no longer approved and unstarted (revoked, or another worker started it first)."""
    stmt = (
        sa.update(approvals)
        .where(approvals.c.id == approval.id, approvals.c.status == ApprovalStatus.APPROVED, approvals.c.started_at.is_(None))
        .values(started_at=_clock(conn))
        .returning(approvals)
    )
    row = (await conn.execute(stmt)).first()
    return _record(row) if row is not None else None


async def close_approvals(
    conn: Connection,
    reason: ApprovalReason,
    *,
    to: ApprovalStatus = ApprovalStatus.REVOKED,
    turn_id: str | None = None,
    session_id: str | None = None,
) -> list[ApprovalRecord]:
    """End every approval of a turn (or of a whole session) whose call can no longer run:
    pending ones, and approved ones that have not started (`revoked`, or `to`). Returns them
    as they are now."""
    if (turn_id is None) == (session_id is None):
        raise InvalidRequestError("close approvals of one turn or of one session")
    scope = approvals.c.turn_id == turn_id if turn_id is not None else approvals.c.session_id == session_id
    open_ = sa.or_(
        approvals.c.status == ApprovalStatus.PENDING,
        sa.and_(approvals.c.status == ApprovalStatus.APPROVED, approvals.c.started_at.is_(None)),
    )
    rows = (await conn.execute(sa.select(approvals).where(scope, open_))).all()
    return [await transition_approval(conn, _record(r), to, reason=reason, unstarted=True) for r in rows]


async def due_for_expiry(conn: Connection, *, limit: int) -> list[ApprovalRecord]:
    """Pending approvals whose time has run out (database clock), oldest expiry first."""
    stmt = (
        sa.select(approvals)
        .where(approvals.c.status == ApprovalStatus.PENDING, approvals.c.expires_at <= _clock(conn))
        .order_by(approvals.c.expires_at)
        .limit(limit)
    )
    return [_record(r) for r in (await conn.execute(stmt)).all()]



async def clear_states(conn: Connection, approval_ids: Sequence[str]) -> list[str]:
    """Delete the stored state (sealed, or clear in a version 1 row) of these approvals, and
    say when; the record of the decision stays. Returns the ids whose state was still there
    (their data keys are the caller's to shred in the same transaction)."""
    if not approval_ids:
        return []
    kept = approvals.c.state_deleted_at.is_(None)
    stmt = (
        sa.update(approvals)
        .where(approvals.c.id.in_(list(approval_ids)), kept)
        .values(sealed_state=None, review=sa.null(), summary=None, run_state=sa.null(), state_deleted_at=_clock(conn))
        .returning(approvals.c.id)
    )
    return [str(i) for i in (await conn.execute(stmt)).scalars().all()]


async def states_past_ttl(conn: Connection, ttls: Mapping[str, float], *, limit: int) -> list[str]:
    """Approvals whose stored state has outlived its time to live (`Settings.run_state_ttls`):
    rejected, revoked or invalidated ones counted from their decision, approved ones from when
    their call started, expired ones from their expiry (database clock). Pending and approved
    unstarted ones are still needed: their expiry bounds them."""
    now = _clock(conn)
    c = approvals.c
    ended = sa.or_(
        sa.and_(c.status.in_([ApprovalStatus.REJECTED, ApprovalStatus.REVOKED, ApprovalStatus.INVALIDATED]),
                c.decided_at + ttls["rejected"] <= now),
        sa.and_(c.status == ApprovalStatus.APPROVED, c.started_at + ttls["completed"] <= now),
        sa.and_(c.status == ApprovalStatus.EXPIRED, c.expires_at + ttls["expired"] <= now),
    )
    stmt = sa.select(c.id).where(c.state_deleted_at.is_(None), ended).limit(limit)
    return [str(i) for i in (await conn.execute(stmt)).scalars().all()]


async def session_approval_ids(conn: Connection, session_id: str) -> list[str]:
    """Every approval of the session whose state is still stored."""
    stmt = sa.select(approvals.c.id).where(approvals.c.session_id == session_id, approvals.c.state_deleted_at.is_(None))
    return [str(i) for i in (await conn.execute(stmt)).scalars().all()]
