"""Turn rows: the turn's lifecycle status and its run state (step, output index).

The status moves only through `transition_turn`, guarded by `cairn.states.TURN_TRANSITIONS`
and conditional on the status its writer read, so a racing writer loses instead of
overwriting (a cancel and a completion of the same turn: exactly one wins). Writes made by a worker for a running turn are fenced: `fence_turn` checks that the
job lease that claimed the turn is still the current one, and `advance_step` records a
model step under the same check, in one statement (style: storage, fencing).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from cairn.errors import CairnMisuseError, InvalidRequestError, LeaseLostError, StatusConflictError
from cairn.states import TURN_TRANSITIONS, TurnStatus
from cairn.store.db import Connection
from cairn.store.pages import Order, Page, fetch_page
from cairn.store.prepared import Prepared
from cairn.store.tables import turns

__all__ = [
    "ACTIVE_STATUSES",
    "TurnRecord",
    "fence_turn",
    "get_turn",
    "insert_turn",
    "list_turns",
    "next_queued_turn",
    "active_turn",
    "advance_step",
    "transition_turn",
    "update_turn",
]

# A session has at most one turn in one of these at a time.
ACTIVE_STATUSES = (TurnStatus.IN_PROGRESS, TurnStatus.WAITING)


@dataclass(frozen=True, slots=True)
class TurnRecord:
    id: str
    session_id: str
    ordinal: int
    status: TurnStatus
    input: list[dict[str, Any]]
    step: int
    next_output_index: int
    cancel_requested: bool
    lease_token: int | None
    error: dict[str, Any] | None
    usage: dict[str, Any] | None
    created_at: float
    started_at: float | None
    completed_at: float | None
    # The run's persisted context, sealed for the turn (`cairn.engine.loop.run_context`); None
    # while it has none.
    context: bytes | None = None


def _record(row: sa.Row[Any]) -> TurnRecord:
    values = row._asdict()
    values["status"] = TurnStatus(values["status"])
    if values["context"] is not None:
        values["context"] = bytes(values["context"])
    return TurnRecord(**values)


async def insert_turn(conn: Connection, record: TurnRecord) -> None:
    TURN_TRANSITIONS.check_initial(record.status)
    await conn.execute(sa.insert(turns).values(**{f: getattr(record, f) for f in TurnRecord.__slots__}))


async def get_turn(conn: Connection, turn_id: str, *, session_id: str | None = None) -> TurnRecord | None:
    stmt = sa.select(turns).where(turns.c.id == turn_id)
    if session_id is not None:
        stmt = stmt.where(turns.c.session_id == session_id)
    row = (await conn.execute(stmt)).first()
    return _record(row) if row is not None else None


async def active_turn(conn: Connection, session_id: str) -> TurnRecord | None:
    """The turn that is running or waiting for the client, if any."""
    stmt = sa.select(turns).where(turns.c.session_id == session_id, turns.c.status.in_(ACTIVE_STATUSES))
    row = (await conn.execute(stmt.order_by(turns.c.ordinal).limit(1))).first()
    return _record(row) if row is not None else None


async def next_queued_turn(conn: Connection, session_id: str) -> TurnRecord | None:
    stmt = sa.select(turns).where(turns.c.session_id == session_id, turns.c.status == TurnStatus.QUEUED)
    row = (await conn.execute(stmt.order_by(turns.c.ordinal).limit(1))).first()
    return _record(row) if row is not None else None


async def list_turns(
    conn: Connection, session_id: str, *, after: str | None, order: Order, limit: int
) -> Page[TurnRecord]:
    after_key = None
    if after is not None:
        anchor = await get_turn(conn, after, session_id=session_id)
        if anchor is None:
            raise InvalidRequestError(f"unknown turn id in `after`: {after}", param="after")
        after_key = (anchor.ordinal,)
    stmt = sa.select(turns).where(turns.c.session_id == session_id)
    page = await fetch_page(conn, stmt, (turns.c.ordinal,), after=after_key, order=order, limit=limit)
    return Page([_record(r) for r in page.data], page.has_more)


async def update_turn(conn: Connection, turn_id: str, **values: Any) -> TurnRecord:
    """Change columns other than the status (which only `transition_turn` writes)."""
    if "status" in values:
        raise CairnMisuseError("turns.status is written only by transition_turn")
    stmt = sa.update(turns).where(turns.c.id == turn_id).values(**values).returning(turns)
    return _record((await conn.execute(stmt)).one())


async def transition_turn(conn: Connection, turn: TurnRecord, to: TurnStatus, **values: Any) -> TurnRecord:
    """Move `turn` from the status it was read in to `to`, with other `values` in the same
    write; only if the table allows the move (`IllegalTransitionError`, before any SQL) and
    the row is still in that status (`StatusConflictError`: another writer moved it first)."""
    TURN_TRANSITIONS.check(turn.status, to)
    stmt = (
        sa.update(turns)
        .where(turns.c.id == turn.id, turns.c.status == turn.status)
        .values(**values, status=to)
        .returning(turns)
    )
    row = (await conn.execute(stmt)).first()
    if row is None:
        raise StatusConflictError(f"turn {turn.id} is no longer {turn.status}; not moved to {to}")
    return _record(row)


_FENCE = Prepared(
    sa.update(turns)
    .where(turns.c.id == sa.bindparam("turn_id"), turns.c.lease_token == sa.bindparam("token"))
    .values(lease_token=sa.bindparam("token"))
)
_ADVANCE_STEP = Prepared(
    sa.update(turns)
    .where(turns.c.id == sa.bindparam("turn_id"), turns.c.lease_token == sa.bindparam("token"))
    .values(
        step=sa.bindparam("step"),
        usage=sa.bindparam("usage", type_=turns.c.usage.type),
        next_output_index=sa.bindparam("next_output_index"),
    )
)


def _lease_lost(turn_id: str, lease_token: int) -> LeaseLostError:
    return LeaseLostError(f"turn {turn_id} is no longer owned by lease {lease_token}")


async def fence_turn(conn: Connection, turn_id: str, lease_token: int) -> None:
    """Lock the turn for this transaction if `lease_token` still owns it, else raise."""
    if await _FENCE.execute(conn, {"turn_id": turn_id, "token": lease_token}) != 1:
        raise _lease_lost(turn_id, lease_token)


async def advance_step(
    conn: Connection, turn: TurnRecord, lease_token: int, *, step: int, usage: dict[str, Any], next_output_index: int
) -> TurnRecord:
    """Record that a model step is done, fenced like `fence_turn`: the hot path of the loop, so
    one statement does both, and the caller's record is updated instead of read back."""
    params = {"turn_id": turn.id, "token": lease_token, "step": step, "usage": usage, "next_output_index": next_output_index}
    if await _ADVANCE_STEP.execute(conn, params) != 1:
        raise _lease_lost(turn.id, lease_token)
    return dataclasses.replace(turn, step=step, usage=usage, next_output_index=next_output_index)
