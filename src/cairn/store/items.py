"""Item rows: the session's conversation, in append order.

`data` holds the wire item (spec §3.7) without `id`, `type`, `status` and `turn_id`,
which have their own columns; `store_item`/`item_wire` are the only translations.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from cairn.store.db import Connection

from cairn.errors import InvalidRequestError
from cairn.ids import new_item_id
from cairn.store.prepared import Prepared
from cairn.store.pages import Order, Page, fetch_page
from cairn.store.tables import items

__all__ = [
    "ItemRecord",
    "get_item",
    "insert_item",
    "list_items",
    "new_item",
    "pending_client_calls",
    "session_items",
    "turn_items",
    "update_item",
]


@dataclass(frozen=True, slots=True)
class ItemRecord:
    id: str
    session_id: str
    turn_id: str
    type: str
    status: str | None
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
    status: str | None = "completed",
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
    return ItemRecord(**row._asdict())


# Every field but the position, which the database assigns.
_INSERTED = tuple(f for f in ItemRecord.__slots__ if f != "position")
_INSERT = Prepared(sa.insert(items).returning(items.c.position), column_keys=_INSERTED)
_UPDATE = Prepared(
    sa.update(items)
    .where(items.c.id == sa.bindparam("item_id"))
    .values(status=sa.bindparam("status"), data=sa.bindparam("data", type_=items.c.data.type))
)


async def insert_item(conn: Connection, record: ItemRecord) -> ItemRecord:
    values = {f: getattr(record, f) for f in _INSERTED}
    position = await _INSERT.scalar(conn, values)
    return ItemRecord(**{**values, "position": int(position)})


async def update_item(conn: Connection, item: ItemRecord, *, status: str | None, data: dict[str, Any]) -> ItemRecord:
    """Change an item's status and content; returns the updated record (no read-back needed)."""
    await _UPDATE.execute(conn, {"item_id": item.id, "status": status, "data": data})
    return dataclasses.replace(item, status=status, data=data)


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
