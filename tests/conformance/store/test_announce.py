"""Cross-process change announcements: delivered on commit on PostgreSQL, absent on SQLite."""

from __future__ import annotations

import anyio
import pytest

from cairn.store.db import Database

pytestmark = pytest.mark.anyio


async def test_announcements_arrive_after_commit_and_never_for_a_rollback(db: Database) -> None:
    heard: list[str] = []
    if db.is_sqlite:
        with anyio.fail_after(1):
            await db.listen(heard.append)  # nothing to listen to: returns at once
        return
    async with anyio.create_task_group() as tg:
        tg.start_soon(db.listen, heard.append)
        with anyio.fail_after(10):
            while not heard:
                async with db.write() as conn:
                    await db.announce(conn, "probe")
                await anyio.sleep(0.05)
        heard.clear()
        with pytest.raises(RuntimeError):
            async with db.write() as conn:
                await db.announce(conn, "rolled-back")
                raise RuntimeError("abort")
        async with db.write() as conn:
            await db.announce(conn, "committed")
        with anyio.fail_after(10):
            while "committed" not in heard:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert "rolled-back" not in heard
