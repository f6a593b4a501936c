"""Item rows: the session's conversation, in append order.

`data` holds the wire item (spec §3.7) without `id`, `type`, `status` and `turn_id`, which
have their own columns; `ItemRecord.wire` is the only translation back. An item is written
once by `insert_item` and then changed only by `transition_item`, which closes an open item
(guarded by `cairn.states.ITEM_TRANSITIONS`, conditional on its status still being open).
Both run on the hot path of the agent loop, so they are compiled once (`Prepared`) and
return the record without reading it back.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from cairn.errors import IllegalTransitionError, InvalidRequestError, StatusConflictError
from cairn.ids import new_item_id
from cairn.states import ITEM_TRANSITIONS, ItemStatus
from cairn.store.db import Connection
from cairn.store.pages import Order, Page, fetch_page
from cairn.store.prepared import Prepared
from cairn.store.tables import items

__all__ = [
    "ItemRecord",
    "get_item",
    "insert_item",
    "list_items",
    "new_item",
    "pending_client_calls",
    "session_items",
    "transition_item",
    "turn_items",
]


@dataclass(frozen=True, slots=True)
class ItemRecord:
    id: str
    session_id: str
    turn_id: str
    type: str
    status: ItemStatus | None
    call_id: str | None
    tool_kind: str | None
    output_index: int | None
    data: dict[str, Any]
    created_at: float
    position: int = 0

    def wire(self) -> dict[str, Any]:
        """The item as the API shows it."""
        wire: dict[str, Any] = {"id": self.id, "type": self.type, "turn_id": self.turn_id}
        if self.status is not None:
            wire["status"] = self.status
        wire.update(self.data)
        return wire


def new_item(
    *,
    session_id: str,
    turn_id: str,
    type: str,
    data: dict[str, Any],
    status: ItemStatus | None = ItemStatus.COMPLETED,
    call_id: str | None = None,
    tool_kind: str | None = None,
    output_index: int | None = None,
) -> ItemRecord:
    """A fresh item with a new id, to be stored with `insert_item`."""
    return ItemRecord(
        id=new_item_id(),
        session_id=session_id,
        turn_id=turn_id,
        type=type,
        status=status,
        call_id=call_id,
        tool_kind=tool_kind,
        output_index=output_index,
        data=data,
        created_at=time.time(),
    )


def _record(row: sa.Row[Any]) -> ItemRecord:
    values = row._asdict()
    if values["status"] is not None:
        values["status"] = ItemStatus(values["status"])
    return ItemRecord(**values)


# Every field but the position, which the database assigns.
_INSERTED = tuple(f for f in ItemRecord.__slots__ if f != "position")
_INSERT = Prepared(sa.insert(items).returning(items.c.position), column_keys=_INSERTED)
_TRANSITION = Prepared(
    sa.update(items)
    .where(items.c.id == sa.bindparam("item_id"), items.c.status == sa.bindparam("from_status"))
    .values(status=sa.bindparam("to_status"), data=sa.bindparam("data", type_=items.c.data.type))
)


async def insert_item(conn: Connection, record: ItemRecord) -> ItemRecord:
    if record.status is not None:
        ITEM_TRANSITIONS.check_initial(record.status)
    values = {f: getattr(record, f) for f in _INSERTED}
    position = await _INSERT.scalar(conn, values)
    return ItemRecord(**{**values, "position": int(position)})


async def transition_item(conn: Connection, item: ItemRecord, to: ItemStatus, *, data: dict[str, Any]) -> ItemRecord:
    """Move `item` from the status it was read in to `to`, with its final content; only if the
    table allows the move (`IllegalTransitionError`, before any SQL) and the row is still in
    that status (`StatusConflictError`). Returns the updated record (no read-back needed)."""
    if item.status is None:
        raise IllegalTransitionError(f"item {item.id} has no status: it never moves")
    ITEM_TRANSITIONS.check(item.status, to)
    params = {"item_id": item.id, "from_status": item.status, "to_status": to, "data": data}
    if await _TRANSITION.execute(conn, params) != 1:
        raise StatusConflictError(f"item {item.id} is no longer {item.status}; not moved to {to}")
    return dataclasses.replace(item, status=to, data=data)


async def get_item(conn: Connection, item_id: str) -> ItemRecord | None:
    row = (await conn.execute(sa.select(items).where(items.c.id == item_id))).first()
    return _record(row) if row is not None else None


async def list_items(
    conn: Connection,
    session_id: str,
    *,
    turn_id: str | None = None,
    after: str | None,
    order: Order,
    limit: int,
) -> Page[ItemRecord]:
    stmt = sa.select(items).where(items.c.session_id == session_id)
    if turn_id is not None:
        stmt = stmt.where(items.c.turn_id == turn_id)
    after_key = None
    if after is not None:
        anchor = await get_item(conn, after)
        if anchor is None or anchor.session_id != session_id:
            raise InvalidRequestError(f"unknown item id in `after`: {after}", param="after")
        after_key = (anchor.position,)
    page = await fetch_page(conn, stmt, (items.c.position,), after=after_key, order=order, limit=limit)
    return Page([_record(r) for r in page.data], page.has_more)


async def turn_items(conn: Connection, turn_id: str) -> list[ItemRecord]:
    stmt = sa.select(items).where(items.c.turn_id == turn_id).order_by(items.c.position)
    return [_record(r) for r in (await conn.execute(stmt)).all()]


async def session_items(conn: Connection, session_id: str) -> list[ItemRecord]:
    stmt = sa.select(items).where(items.c.session_id == session_id).order_by(items.c.position)
    return [_record(r) for r in (await conn.execute(stmt)).all()]


async def pending_client_calls(conn: Connection, turn_id: str) -> list[ItemRecord]:
    """Client function calls of the turn that have no `function_call_output` yet."""
    answered = sa.select(items.c.call_id).where(items.c.turn_id == turn_id, items.c.type == "function_call_output")
    stmt = (
        sa.select(items)
        .where(
            items.c.turn_id == turn_id,
            items.c.type == "function_call",
            items.c.tool_kind == "client",
            items.c.call_id.not_in(answered),
        )
        .order_by(items.c.position)
    )
    return [_record(r) for r in (await conn.execute(stmt)).all()]
