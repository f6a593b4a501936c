"""The sweep lock: publishes share it, a sweep excludes them, on SQLite and PostgreSQL."""

from __future__ import annotations

import anyio
import pytest
import sqlalchemy as sa

from cairn.errors import CairnMisuseError
from cairn.store.blob_locks import hold_publish_lock, hold_sweep_lock
from cairn.store.db import Database

pytestmark = pytest.mark.anyio


async def _waiting_for_lock(db: Database) -> None:
    """Until another transaction waits for the lock (PostgreSQL shows it; a SQLite writer
    retries BEGIN IMMEDIATE, which only letting it run can show)."""
    if db.is_sqlite:
        # Not a wait for state: the other side cannot get in however long this is, and a
        # broken lock lets it in within this time.
        await anyio.sleep(0.1)
        return
    query = sa.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
    with anyio.fail_after(10):
        while True:
            async with db.read() as conn:
                if (await conn.execute(query)).scalar_one():
                    return
            await anyio.sleep(0.01)


@pytest.mark.parametrize("holder", ["publish", "sweep"])
async def test_a_sweep_and_a_publish_never_hold_the_lock_at_once(db: Database, database_url: str, holder: str) -> None:
    other_db = Database(database_url)
    first, second = (hold_publish_lock, hold_sweep_lock) if holder == "publish" else (hold_sweep_lock, hold_publish_lock)
    entered = anyio.Event()

    async def other() -> None:
        async with other_db.write() as conn:
            await second(conn)
            entered.set()

    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                async with db.write() as conn:
                    await first(conn)
                    tg.start_soon(other)
                    await _waiting_for_lock(db)
                    assert not entered.is_set()
                await entered.wait()
    finally:
        await other_db.dispose()


async def test_publishes_share_the_lock(db: Database, database_url: str) -> None:
    if db.is_sqlite:
        pytest.skip("SQLite has one writer at a time: publishes serialize on its write lock anyway")
    other_db = Database(database_url)
    try:
        with anyio.fail_after(10):
            async with db.write() as conn, other_db.write() as other_conn:
                await hold_publish_lock(conn)
                await hold_publish_lock(other_conn)
    finally:
        await other_db.dispose()


async def test_the_lock_is_refused_outside_a_write_transaction_on_sqlite(db: Database) -> None:
    if not db.is_sqlite:
        # PostgreSQL's advisory lock is the same in any transaction.
        async with db.read() as conn:
            await hold_sweep_lock(conn)
        return
    with pytest.raises(CairnMisuseError, match="Database.write"):
        async with db.read() as conn:
            await hold_sweep_lock(conn)
