"""A session's writers take its lock in one order, so they queue instead of deadlocking.

A request that locked the session and then touches a turn (a cancel) meets a worker whose
transaction touches the turn first and the session last (its events). Without one order,
PostgreSQL aborts one of them with a deadlock; with it, the second simply waits.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import sqlalchemy as sa

from cairn.bootstrap import build_runtime
from cairn.config import Settings
from cairn.engine.sessions import SessionService
from cairn.store.db import Database
from cairn.store.sessions import get_session
from cairn.store.tables import turns
from tests.lock_waits import LockWaits

pytestmark = pytest.mark.anyio


async def test_a_request_and_a_worker_writing_one_session_queue_up(db: Database, tmp_path: Path) -> None:
    runtime = build_runtime(Settings(data_dir=tmp_path, scripts_dir=tmp_path), db)
    (tmp_path / "s.json").write_text('{"turns": [[{"say": "hi"}]]}')
    message = {"role": "user", "content": [{"type": "input_text", "text": "go"}]}
    created = await SessionService(runtime).create("t", {"agent": {"model": "scripted:s"}, "environment": {"type": "none"}, "input": [message]})
    session_id, turn_id = created.session.id, created.turn_id
    holding = anyio.Event()
    order: list[str] = []

    async def request() -> None:
        async with runtime.journal.transaction(session_id) as tx:
            assert await get_session(tx.conn, session_id, for_update=True) is not None
            holding.set()
            await waits.until_another_waits(db, "the worker's transaction to wait for the session")
            await tx.conn.execute(sa.update(turns).where(turns.c.id == turn_id).values(cancel_requested=True))
            tx.emit({"type": "test.request"})
        order.append("request")

    async def worker() -> None:
        await holding.wait()
        async with runtime.journal.transaction(session_id) as tx:
            await tx.conn.execute(sa.update(turns).where(turns.c.id == turn_id).values(step=turns.c.step + 1))
            tx.emit({"type": "test.worker"})
        order.append("worker")

    with LockWaits() as waits:
        async with anyio.create_task_group() as tg:
            tg.start_soon(request)
            tg.start_soon(worker)
    assert order == ["request", "worker"]
    async with db.read() as conn:
        row = (await conn.execute(sa.select(turns.c.step, turns.c.cancel_requested).where(turns.c.id == turn_id))).one()
    assert tuple(row) == (1, True)
