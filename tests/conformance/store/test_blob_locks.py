"""The sweep lock: publishes share it, a sweep excludes them, on SQLite and PostgreSQL."""

from __future__ import annotations

import anyio
import pytest

from cairn.errors import CairnMisuseError
from cairn.store.blob_locks import hold_publish_lock, hold_sweep_lock
from cairn.store.db import Database
from tests.lock_waits import LockWaits

pytestmark = pytest.mark.anyio


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
                    with LockWaits() as waits:
                        tg.start_soon(other)
                        await waits.until_another_waits(db, "the other transaction to wait for the lock")
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
