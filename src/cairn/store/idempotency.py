"""Idempotency keys of input events (spec §1.8).

A key is recorded in the same transaction as the effect it guards, so a request that
failed (for example the tool-result race, answered 400) leaves no record and its retry
with the same key is processed afresh. A repeat of a recorded key changes nothing.
"""

from __future__ import annotations

import time

import sqlalchemy as sa

from cairn.errors import InvalidRequestError
from cairn.store.db import Connection
from cairn.store.tables import idempotency_keys

__all__ = ["record_idempotency_key"]


async def record_idempotency_key(conn: Connection, session_id: str, key: str, request_digest: str) -> bool:
    """Record `key`; return True when it was already recorded for the same request."""
    stmt = sa.select(idempotency_keys.c.request_digest).where(
        idempotency_keys.c.session_id == session_id, idempotency_keys.c.key == key
    )
    existing = (await conn.execute(stmt)).scalar_one_or_none()
    if existing is not None:
        if existing != request_digest:
            raise InvalidRequestError(
                "Idempotency-Key was already used with a different request body", code="idempotency_key_reused"
            )
        return True
    await conn.execute(
        sa.insert(idempotency_keys).values(session_id=session_id, key=key, request_digest=request_digest, created_at=time.time())
    )
    return False
