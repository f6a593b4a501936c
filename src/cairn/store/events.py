"""The event log: append-only, gap-free per-session sequence numbers (design invariant 1).

`append_events` advances the session's counter and inserts the events in the caller's
transaction, so an event is durable before anyone can read it, and a rolled-back
transaction leaves no hole. Sequence numbers start at 1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from cairn.store.db import Connection
from cairn.store.prepared import Prepared
from cairn.store.tables import events, sessions

__all__ = ["EventRecord", "append_events", "event_id", "read_events_after"]


@dataclass(frozen=True, slots=True)
class EventRecord:
    session_id: str
    seq: int
    type: str
    turn_id: str | None
    data: str  # the serialized wire event
    created_at: float


_ADVANCE_SEQ = Prepared(
    sa.update(sessions)
    .where(sessions.c.id == sa.bindparam("sid"))
    .values(last_event_seq=sessions.c.last_event_seq + sa.bindparam("count"))
    .returning(sessions.c.last_event_seq)
)
_INSERT = Prepared(sa.insert(events), column_keys=EventRecord.__slots__)
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def event_id(session_id: str, seq: int) -> str:
    """Stable and unique across sessions, so replays carry the same id (clients dedupe on it)."""
    return f"evt_{session_id.removeprefix('sess_')}_{seq}"


async def append_events(
    conn: Connection, session_id: str, payloads: Sequence[dict[str, Any]]
) -> list[EventRecord]:
    """Number, serialize and store `payloads` (each has at least `type`) in order."""
    if not payloads:
        return []
    last = int(await _ADVANCE_SEQ.scalar(conn, {"sid": session_id, "count": len(payloads)}))
    now = time.time()
    records = []
    for offset, payload in enumerate(payloads):
        seq = last - len(payloads) + 1 + offset
        wire = {"type": payload["type"], "event_id": event_id(session_id, seq), "sequence_number": seq}
        wire.update((k, v) for k, v in payload.items() if k != "type")
        records.append(
            EventRecord(
                session_id=session_id,
                seq=seq,
                type=payload["type"],
                turn_id=payload.get("turn_id"),
                data=_encode(wire),
                created_at=now,
            )
        )
    await _INSERT.execute(conn, [{f: getattr(r, f) for f in EventRecord.__slots__} for r in records])
    return records


async def read_events_after(conn: Connection, session_id: str, seq: int, *, limit: int) -> list[EventRecord]:
    stmt = (
        sa.select(events)
        .where(events.c.session_id == session_id, events.c.seq > seq)
        .order_by(events.c.seq)
        .limit(limit)
    )
    return [EventRecord(**r._asdict()) for r in (await conn.execute(stmt)).all()]
