"""Keyset pagination shared by every list: `after` is exclusive in the chosen order.

Lists fetch one row more than asked for, so `has_more` is exact without a count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import sqlalchemy as sa

from cairn.store.db import Connection

__all__ = ["Order", "Page", "fetch_page"]

T = TypeVar("T")
Order = Literal["asc", "desc"]


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    data: list[T]
    has_more: bool


async def fetch_page(
    conn: Connection,
    stmt: sa.Select[Any],
    key: Sequence[sa.ColumnElement[Any]],
    *,
    after: Sequence[Any] | None,
    order: Order,
    limit: int,
) -> Page[sa.Row[Any]]:
    """Run `stmt` ordered by `key`, starting after the row whose key is `after`."""
    key_expr = sa.tuple_(*key) if len(key) > 1 else key[0]
    if after is not None:
        bound = sa.tuple_(*[sa.literal(v) for v in after]) if len(key) > 1 else sa.literal(after[0])
        stmt = stmt.where(key_expr > bound if order == "asc" else key_expr < bound)
    ordering = [c.asc() if order == "asc" else c.desc() for c in key]
    rows = list((await conn.execute(stmt.order_by(*ordering).limit(limit + 1))).all())
    return Page(data=rows[:limit], has_more=len(rows) > limit)
