"""Cross-process change announcements: delivered on commit on PostgreSQL, absent on SQLite."""

from __future__ import annotations

import anyio
import pytest

from cairn.store.db import Database
from tests.waits import until

pytestmark = pytest.mark.anyio


async def test_announcements_arrive_after_commit_and_never_for_a_rollback(db: Database) -> None:
    heard: list[str] = []
    if db.is_sqlite:
        with anyio.fail_after(1):
            await db.listen(heard.append)  # nothing to listen to: returns at once
        return
    async with anyio.create_task_group() as tg:
        tg.start_soon(db.listen, heard.append)

        async def heard_a_probe() -> bool:
            async with db.write() as conn:
                await db.announce(conn, "probe")
            return bool(heard)

        # Until the listener is in place: what is announced before it listens is not heard.
        await until(heard_a_probe, "an announcement to be heard", interval_s=0.05)
        heard.clear()
        with pytest.raises(RuntimeError):
            async with db.write() as conn:
                await db.announce(conn, "rolled-back")
                raise RuntimeError("abort")
        async with db.write() as conn:
            await db.announce(conn, "committed")
        await until(lambda: "committed" in heard, "the committed announcement", seen=lambda: heard)
        tg.cancel_scope.cancel()
    assert "rolled-back" not in heard
