"""Artifact rows: immutable records binding published content to `(turn_id, path)`.

The bytes live in the content-addressed blob store under `sha256`; a row is metadata only.
Content is shared by every row with the same digest, in any session of any tenant, and
is freed by blob garbage collection once no row references it (`referenced_digests`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from cairn.errors import InvalidRequestError
from cairn.store.db import Connection, InlineConnection
from cairn.store.pages import Order, Page, fetch_page
from cairn.store.tables import artifacts

__all__ = [
    "ArtifactRecord",
    "delete_artifact",
    "get_artifact",
    "insert_artifact",
    "list_artifacts",
    "referenced_digests",
]


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    id: str
    session_id: str
    tenant: str
    turn_id: str
    environment_id: str
    path: str
    size_bytes: int
    sha256: str
    created_at: float
    position: int = 0

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "agent.session.artifact",
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "environment_id": self.environment_id,
            "path": self.path,
            "size_bytes": self.size_bytes,
            "created_at": int(self.created_at),
        }


def _record(row: sa.Row[Any]) -> ArtifactRecord:
    return ArtifactRecord(**row._asdict())


async def insert_artifact(conn: Connection, record: ArtifactRecord) -> None:
    values = {f: getattr(record, f) for f in ArtifactRecord.__slots__ if f != "position"}
    await conn.execute(sa.insert(artifacts).values(**values))


async def get_artifact(conn: Connection, session_id: str, artifact_id: str) -> ArtifactRecord | None:
    stmt = sa.select(artifacts).where(artifacts.c.id == artifact_id, artifacts.c.session_id == session_id)
    row = (await conn.execute(stmt)).first()
    return _record(row) if row is not None else None


async def list_artifacts(
    conn: Connection,
    session_id: str,
    *,
    environment_id: str | None,
    after: str | None,
    order: Order,
    limit: int,
) -> Page[ArtifactRecord]:
    stmt = sa.select(artifacts).where(artifacts.c.session_id == session_id)
    if environment_id is not None:
        stmt = stmt.where(artifacts.c.environment_id == environment_id)
    after_key = None
    if after is not None:
        anchor = await get_artifact(conn, session_id, after)
        if anchor is None:
            raise InvalidRequestError(f"unknown artifact id in `after`: {after}", param="after")
        after_key = (anchor.position,)
    page = await fetch_page(conn, stmt, (artifacts.c.position,), after=after_key, order=order, limit=limit)
    return Page([_record(r) for r in page.data], page.has_more)


async def delete_artifact(conn: Connection, artifact_id: str) -> None:
    await conn.execute(sa.delete(artifacts).where(artifacts.c.id == artifact_id))


async def referenced_digests(conn: Connection, digests: Collection[str]) -> set[str]:
    """Those of `digests` that some artifact row, of any session and tenant, references.

    One lookup on the indexed `sha256` column: callers pass bounded batches, so the garbage
    collector never loads every row. PostgreSQL gets the batch as one array parameter: as
    hundreds of `IN` parameters, each query made enough short-lived objects to bring on
    Python's full garbage collections, pausing the event loop ~100 ms several times a
    sweep. SQLite (inline, no arrays) takes the `IN` list.
    """
    if not digests:
        return set()
    match: sa.ColumnElement[bool]
    if isinstance(conn, InlineConnection):
        match = artifacts.c.sha256.in_(list(digests))
    else:
        batch = sa.bindparam("digests", list(digests), type_=postgresql.ARRAY(sa.String))
        match = artifacts.c.sha256 == sa.any_(batch)
    stmt = sa.select(artifacts.c.sha256).where(match).distinct()
    return set((await conn.execute(stmt)).scalars())
