"""Session rows: create, read within a tenant, update, delete.

A session row also carries the per-session event counter (`last_event_seq`, advanced only
by `store.events.append_events`) and the turn counter (`next_turn_ordinal`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from cairn.store.db import Connection

from cairn.errors import InvalidRequestError
from cairn.store.pages import Order, Page, fetch_page
from cairn.store.tables import api_keys, sessions

__all__ = [
    "SessionRecord",
    "allocate_turn_ordinal",
    "delete_session",
    "get_session",
    "insert_session",
    "list_sessions",
    "list_tenants",
    "update_session",
]


@dataclass(frozen=True, slots=True)
class SessionRecord:
    id: str
    tenant: str
    status: str
    agent: dict[str, Any]
    environment: dict[str, Any]
    environment_id: str
    metadata: dict[str, str]
    extra: dict[str, Any]
    error: str | None
    usage: dict[str, Any] | None
    last_event_seq: int
    next_turn_ordinal: int
    outputs_manifest: dict[str, dict[str, Any]]
    created_at: float
    last_active_at: float


def _record(row: sa.Row[Any]) -> SessionRecord:
    return SessionRecord(**row._asdict())


async def insert_session(conn: Connection, record: SessionRecord) -> None:
    await conn.execute(sa.insert(sessions).values(**{f: getattr(record, f) for f in SessionRecord.__slots__}))


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
    return _record(row) if row is not None else None


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
    return Page([_record(r) for r in page.data], page.has_more)


async def update_session(conn: Connection, session_id: str, **values: Any) -> SessionRecord:
    row = (
        await conn.execute(sa.update(sessions).where(sessions.c.id == session_id).values(**values).returning(sessions))
    ).one()
    return _record(row)


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
