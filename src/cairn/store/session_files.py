"""A session's inline files, stored with it until a worker seeds its first workspace."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from cairn.store.db import Connection
from cairn.store.tables import session_files

__all__ = ["insert_session_files", "load_session_files"]


async def insert_session_files(conn: Connection, session_id: str, files: Sequence[tuple[str, bytes]]) -> None:
    """Store `(path, content)` pairs in the order given (later ones win on the same path)."""
    if files:
        rows = [{"session_id": session_id, "position": i, "path": path, "data": data} for i, (path, data) in enumerate(files)]
        await conn.execute(sa.insert(session_files), rows)


async def load_session_files(conn: Connection, session_id: str) -> list[tuple[str, bytes]]:
    stmt = sa.select(session_files.c.path, session_files.c.data).where(session_files.c.session_id == session_id)
    rows = (await conn.execute(stmt.order_by(session_files.c.position))).all()
    return [(str(row.path), bytes(row.data)) for row in rows]
