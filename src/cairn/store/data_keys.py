"""Data key rows: the wrapped data key of each sealed blob (`cairn.durable.crypto`).

This module is the only writer of `data_keys`. A row is inserted in the transaction that
stores its blob, deleted in the one that deletes the blob's record (or by a sweep after a
crash), and otherwise changes only when a master key rotation re-wraps it: a compare-and-set
on the version it was read with, so a rewrap never overwrites a newer one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from cairn.store.db import Connection
from cairn.store.prepared import Prepared
from cairn.store.tables import data_keys, turns

__all__ = [
    "DataKeyRecord",
    "count_by_version",
    "delete_data_keys",
    "delete_record_keys",
    "delete_session_turn_keys",
    "first_key_at",
    "get_data_key",
    "insert_data_key",
    "keys_not_at",
    "orphaned_keys",
    "set_wrapped",
]


@dataclass(frozen=True, slots=True)
class DataKeyRecord:
    id: str
    tenant: str
    kind: str
    record_id: str
    key_version: int
    wrapped: bytes
    created_at: float


def _record(row: sa.Row[Any]) -> DataKeyRecord:
    return DataKeyRecord(**row._asdict())


# Every pause seals and every resume opens: these two run as prepared statements
# (`cairn.store.prepared`), which halves what a seal adds to a 10 KB pause on SQLite.
_INSERT = Prepared(sa.insert(data_keys), column_keys=DataKeyRecord.__slots__)
_GET = Prepared(sa.select(*(data_keys.c[f] for f in DataKeyRecord.__slots__)).where(data_keys.c.id == sa.bindparam("key_id")))


async def insert_data_key(conn: Connection, record: DataKeyRecord) -> None:
    await _INSERT.execute(conn, {f: getattr(record, f) for f in DataKeyRecord.__slots__})


async def get_data_key(conn: Connection, key_id: str) -> DataKeyRecord | None:
    rows = await _GET.rows(conn, {"key_id": key_id})
    if not rows:
        return None
    values = dict(zip(DataKeyRecord.__slots__, rows[0]))
    return DataKeyRecord(**{**values, "key_version": int(values["key_version"]), "wrapped": bytes(values["wrapped"]),
                            "created_at": float(values["created_at"])})


async def delete_data_keys(conn: Connection, key_ids: Sequence[str]) -> int:
    """Delete these data keys; their blobs can never be opened again. Returns how many went."""
    if not key_ids:
        return 0
    return int((await conn.execute(sa.delete(data_keys).where(data_keys.c.id.in_(list(key_ids))))).rowcount)


async def delete_record_keys(conn: Connection, kind: str, record_ids: Sequence[str]) -> int:
    """Delete the data keys of every blob of these records."""
    if not record_ids:
        return 0
    stmt = sa.delete(data_keys).where(data_keys.c.kind == kind, data_keys.c.record_id.in_(list(record_ids)))
    return int((await conn.execute(stmt)).rowcount)


async def delete_session_turn_keys(conn: Connection, kind: str, session_id: str) -> int:
    """Delete the data keys of `kind` whose record is one of the session's turns."""
    of_session = sa.select(turns.c.id).where(turns.c.session_id == session_id)
    return int((await conn.execute(sa.delete(data_keys).where(data_keys.c.kind == kind, data_keys.c.record_id.in_(of_session)))).rowcount)


async def keys_not_at(conn: Connection, version: int, *, after: str | None, limit: int) -> list[DataKeyRecord]:
    """Data keys wrapped by another master key version than `version`, by id, after `after`."""
    stmt = sa.select(data_keys).where(data_keys.c.key_version != version)
    if after is not None:
        stmt = stmt.where(data_keys.c.id > after)
    return [_record(r) for r in (await conn.execute(stmt.order_by(data_keys.c.id).limit(limit))).all()]


async def set_wrapped(conn: Connection, record: DataKeyRecord, version: int, wrapped: bytes) -> bool:
    """Store a data key re-wrapped by `version`, if its row still has the version it was read
    with (False: deleted, or re-wrapped by another rotation meanwhile)."""
    stmt = (
        sa.update(data_keys)
        .where(data_keys.c.id == record.id, data_keys.c.key_version == record.key_version)
        .values(key_version=version, wrapped=wrapped)
    )
    return int((await conn.execute(stmt)).rowcount) == 1


async def first_key_at(conn: Connection, version: int) -> DataKeyRecord | None:
    """One data key wrapped by `version` (the one with the lowest id), if any."""
    stmt = sa.select(data_keys).where(data_keys.c.key_version == version).order_by(data_keys.c.id).limit(1)
    row = (await conn.execute(stmt)).first()
    return _record(row) if row is not None else None


async def count_by_version(conn: Connection) -> dict[int, int]:
    """How many data keys each master key version wraps."""
    stmt = sa.select(data_keys.c.key_version, sa.func.count()).group_by(data_keys.c.key_version)
    return {int(version): int(count) for version, count in (await conn.execute(stmt)).all()}


async def orphaned_keys(
    conn: Connection, kind: str, records: sa.Table, *, id_column: str = "id", keeps: sa.ColumnElement[bool] | None = None,
    limit: int,
) -> list[str]:
    """Data keys of `kind` whose record is no longer in `records` (by its `id_column`), or no
    longer keeps its sealed blob (`keeps` false): what a crash, a restore or a hand-made
    deletion left between deleting a record's blobs and their keys."""
    live = records.c[id_column] == data_keys.c.record_id
    if keeps is not None:
        live = sa.and_(live, keeps)
    stmt = sa.select(data_keys.c.id).where(data_keys.c.kind == kind, ~sa.exists().where(live)).limit(limit)
    return [str(key_id) for key_id in (await conn.execute(stmt)).scalars().all()]
