"""Session rows: create, read within a tenant, update, delete.

A session row also carries the per-session event counter (`last_event_seq`, advanced only
by `store.events.append_events`) and the turn counter (`next_turn_ordinal`). Each durable
fact has one writer: the status moves only through `transition_session` (guarded by
`cairn.states.SESSION_TRANSITIONS`), the environment's status only through
`set_environment_status`, the settings (`prompt_cache_options`, `review`, `spend_control`)
and `env` only at create and update, the pinned agent version and revision and the vault ids only at create; the required actions live in their own table
(`cairn.store.required_actions`), and a record read here carries them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from cairn.errors import CairnMisuseError, InvalidRequestError, StatusConflictError
from cairn.states import SESSION_TRANSITIONS, EnvironmentStatus, SessionStatus
from cairn.store.db import Connection
from cairn.store.pages import Order, Page, fetch_page
from cairn.store.prepared import Prepared
from cairn.store.required_actions import RequiredAction, actions_of
from cairn.store.tables import api_keys, sessions

__all__ = [
    "SessionRecord",
    "allocate_turn_ordinal",
    "delete_session",
    "get_session",
    "insert_session",
    "list_sessions",
    "list_tenants",
    "lock_session",
    "set_environment_status",
    "transition_session",
    "update_session",
]


@dataclass(frozen=True, slots=True)
class SessionRecord:
    id: str
    tenant: str
    status: SessionStatus
    agent: dict[str, Any]
    environment: dict[str, Any]
    environment_id: str
    metadata: dict[str, str]
    error: str | None
    usage: dict[str, Any] | None
    last_event_seq: int
    next_turn_ordinal: int
    outputs_manifest: dict[str, dict[str, Any]]
    created_at: float
    last_active_at: float
    env: dict[str, str] = field(default_factory=dict)
    environment_status: EnvironmentStatus | None = None
    prompt_cache_options: dict[str, Any] | None = None
    review: str | None = None
    spend_control: dict[str, Any] | None = None
    # The registered agent version (and its revision) a session made with `agent_id` is
    # pinned to for its life; None for a session that brought its own agent.
    agent_version: str | None = None
    agent_revision: str | None = None
    # The tenant's vaults whose credentials the session's turns get, in the order given.
    vault_ids: list[str] = field(default_factory=list)
    # Not a column: the rows of `required_actions`, filled in by every read of this module.
    required_actions: tuple[RequiredAction, ...] = ()


_COLUMNS = tuple(f for f in SessionRecord.__slots__ if f != "required_actions")
# Written only by their own functions below.
_OWNED = {
    "status": "transition_session",
    "environment_status": "set_environment_status",
    "agent_version": "insert_session",
    "agent_revision": "insert_session",
    "vault_ids": "insert_session",
}


def _record(row: sa.Row[Any]) -> SessionRecord:
    values = row._asdict()
    values["status"] = SessionStatus(values["status"])
    if values["environment_status"] is not None:
        values["environment_status"] = EnvironmentStatus(values["environment_status"])
    return SessionRecord(**values)


async def _with_actions(conn: Connection, records: Sequence[SessionRecord]) -> list[SessionRecord]:
    """`records` with their required actions; only a session that requires action has any
    (they are added and dropped in the transactions that move it in and out of that state),
    so the others cost no query."""
    waiting = [r.id for r in records if r.status == SessionStatus.REQUIRES_ACTION]
    found = await actions_of(conn, waiting)
    return [dataclasses.replace(r, required_actions=found[r.id]) if r.id in found else r for r in records]


async def _one(conn: Connection, row: sa.Row[Any]) -> SessionRecord:
    return (await _with_actions(conn, [_record(row)]))[0]


async def insert_session(conn: Connection, record: SessionRecord) -> None:
    SESSION_TRANSITIONS.check_initial(record.status)
    await conn.execute(sa.insert(sessions).values(**{f: getattr(record, f) for f in _COLUMNS}))


_LOCK = Prepared(sa.select(sessions.c.id).where(sessions.c.id == sa.bindparam("sid")).with_for_update())


async def lock_session(conn: Connection, session_id: str) -> None:
    """Take the session row's lock for the rest of the transaction (PostgreSQL; SQLite's
    `BEGIN IMMEDIATE` already holds the whole database)."""
    if conn.dialect.name != "sqlite":
        await _LOCK.execute(conn, {"sid": session_id})


async def get_session(
    conn: Connection, session_id: str, *, tenant: str | None = None, for_update: bool = False
) -> SessionRecord | None:
    """The session, or None when it does not exist or belongs to another tenant."""
    stmt = sa.select(sessions).where(sessions.c.id == session_id)
    if tenant is not None:
        stmt = stmt.where(sessions.c.tenant == tenant)
    if for_update:
        stmt = stmt.with_for_update()
    row = (await conn.execute(stmt)).first()
    return await _one(conn, row) if row is not None else None


async def list_sessions(
    conn: Connection,
    tenant: str,
    *,
    after: str | None,
    order: Order,
    limit: int,
    metadata: Mapping[str, str],
    agent_id: str | None = None,
) -> Page[SessionRecord]:
    """A page of the tenant's sessions; the filters are part of the query, so a page is full
    unless it is the last."""
    stmt = sa.select(sessions).where(sessions.c.tenant == tenant)
    for key, value in metadata.items():
        stmt = stmt.where(sessions.c.metadata[key].as_string() == value)
    if agent_id is not None:
        stmt = stmt.where(sessions.c.agent["id"].as_string() == agent_id)
    after_key = None
    if after is not None:
        anchor = await get_session(conn, after, tenant=tenant)
        if anchor is None:
            raise InvalidRequestError(f"unknown session id in `after`: {after}", param="after")
        after_key = (anchor.created_at, anchor.id)
    page = await fetch_page(conn, stmt, (sessions.c.created_at, sessions.c.id), after=after_key, order=order, limit=limit)
    return Page(await _with_actions(conn, [_record(r) for r in page.data]), page.has_more)


async def update_session(conn: Connection, session_id: str, **values: Any) -> SessionRecord:
    """Change columns that have no writer of their own (settings, agent, metadata, usage, times)."""
    owned = sorted(_OWNED.keys() & values.keys())
    if owned:
        raise CairnMisuseError(f"sessions.{owned[0]} is written only by {_OWNED[owned[0]]}")
    row = (
        await conn.execute(sa.update(sessions).where(sessions.c.id == session_id).values(**values).returning(sessions))
    ).one()
    return await _one(conn, row)


async def transition_session(
    conn: Connection, session: SessionRecord, to: SessionStatus, *, last_active_at: float
) -> SessionRecord:
    """Move `session` from the status it was read in to `to`; only if the table allows the move (`IllegalTransitionError`, before any SQL) and
    the row is still in that status (`StatusConflictError`: another writer moved it first)."""
    SESSION_TRANSITIONS.check(session.status, to)
    stmt = (
        sa.update(sessions)
        .where(sessions.c.id == session.id, sessions.c.status == session.status)
        .values(status=to, last_active_at=last_active_at)
        .returning(sessions)
    )
    row = (await conn.execute(stmt)).first()
    if row is None:
        raise StatusConflictError(f"session {session.id} is no longer {session.status}; not moved to {to}")
    return await _one(conn, row)


async def set_environment_status(conn: Connection, session_id: str, status: EnvironmentStatus) -> SessionRecord | None:
    """Record what the session's workspace is now; None if the session is gone."""
    stmt = (
        sa.update(sessions).where(sessions.c.id == session_id).values(environment_status=status).returning(sessions)
    )
    row = (await conn.execute(stmt)).first()
    return await _one(conn, row) if row is not None else None


async def allocate_turn_ordinal(conn: Connection, session_id: str) -> int:
    stmt = (
        sa.update(sessions)
        .where(sessions.c.id == session_id)
        .values(next_turn_ordinal=sessions.c.next_turn_ordinal + 1)
        .returning(sessions.c.next_turn_ordinal)
    )
    return int((await conn.execute(stmt)).scalar_one()) - 1


async def list_tenants(conn: Connection) -> list[str]:
    """Every tenant that has a key or a session."""
    stmt = sa.union(sa.select(sessions.c.tenant), sa.select(api_keys.c.tenant))
    return sorted(str(t) for t in (await conn.execute(stmt)).scalars().all())


async def delete_session(conn: Connection, session_id: str) -> None:
    await conn.execute(sa.delete(sessions).where(sessions.c.id == session_id))
