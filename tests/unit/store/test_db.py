"""SQLite transactions on the event loop: lock waits, and connections kept between transactions."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import sqlalchemy as sa

from cairn.store.db import Database
from cairn.store.migrate import upgrade
from cairn.store.tables import api_keys

pytestmark = pytest.mark.anyio


def _insert_key(n: int) -> sa.Insert:
    return sa.insert(api_keys).values(id=f"key_{n}", tenant="t1", role="member", key_hash=f"hash_{n}", created_at=1.0)


async def _key_ids(db: Database) -> list[str]:
    async with db.read() as conn:
        return list((await conn.execute(sa.select(api_keys.c.id).order_by(api_keys.c.id))).scalars())


async def test_a_write_waits_for_the_write_lock_another_connection_holds(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cairn.db'}"
    first, second = Database(url), Database(url)  # as two processes would
    await upgrade(first)
    order: list[str] = []

    async def write_second() -> None:
        async with second.write() as conn:
            order.append("second")
            await conn.execute(_insert_key(2))

    try:
        async with anyio.create_task_group() as tg:
            async with first.write() as conn:
                await conn.execute(_insert_key(1))
                tg.start_soon(write_second)
                await anyio.wait_all_tasks_blocked()  # the second write is waiting for the lock, off SQLite
                order.append("first")
        assert order == ["first", "second"]
        assert await _key_ids(first) == ["key_1", "key_2"]
    finally:
        await first.dispose()
        await second.dispose()


async def test_a_connection_kept_after_a_failed_transaction_starts_the_next_one_clean(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'cairn.db'}")
    await upgrade(db)
    try:
        with pytest.raises(ZeroDivisionError):
            async with db.write() as conn:
                await conn.execute(_insert_key(1))
                raise ZeroDivisionError
        async with db.write() as conn:
            await conn.execute(_insert_key(2))
        # Several at once need several connections; each goes back clean.
        async with db.read() as a, db.read() as b:
            assert (await a.execute(sa.select(sa.func.count()).select_from(api_keys))).scalar_one() == 1
            assert (await b.execute(sa.select(sa.func.count()).select_from(api_keys))).scalar_one() == 1
        assert await _key_ids(db) == ["key_2"]
    finally:
        await db.dispose()
