"""The event stream's delivery path (`cairn.api.sse.event_stream`) against a real SQLite log:
replay and live meet without a seam, order survives out-of-order publication, other
processes' appends arrive by polling, and slow or stalled subscribers block nobody."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from cairn.api.sse import KEEPALIVE, event_stream
from cairn.bootstrap import build_runtime
from cairn.config import Settings
from cairn.engine.journal import Journal
from cairn.engine.notifier import Notifier
from cairn.engine.runtime import Runtime
from cairn.ids import new_session_id
from cairn.store.db import Database
from cairn.store.events import append_events
from cairn.store.migrate import upgrade
from cairn.store.sessions import SessionRecord, delete_session, insert_session
from tests.waits import until

pytestmark = pytest.mark.anyio


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[Runtime]:
    db = Database(f"sqlite:///{tmp_path / 'cairn.db'}")
    await upgrade(db)
    rt = build_runtime(Settings(data_dir=tmp_path, poll_interval_s=0.05), db)
    yield rt
    await db.dispose()


async def _new_session(rt: Runtime) -> str:
    now = time.time()
    record = SessionRecord(
        id=new_session_id(), tenant="t", status="idle", agent={"model": "scripted:x"}, environment={"type": "none"},
        environment_id="env_1", metadata={}, error=None, usage=None, last_event_seq=0, next_turn_ordinal=0,
        outputs_manifest={}, created_at=now, last_active_at=now,
    )
    async with rt.db.write() as conn:
        await insert_session(conn, record)
    return record.id


async def _append(rt: Runtime, session_id: str, count: int, batch: int = 100) -> None:
    for start in range(0, count, batch):
        async with rt.journal.transaction(session_id) as tx:
            tx.emit(*({"type": "x", "i": i} for i in range(start, min(count, start + batch))))


def _seqs(chunk: bytes) -> list[int]:
    return [json.loads(part[6:])["sequence_number"] for part in chunk.split(b"\n\n") if part.startswith(b"data: ")]


class Reader:
    """Pulls a stream's chunks, optionally slowly, and records the sequence numbers."""

    def __init__(self, stream: AsyncIterator[bytes], delay_s: float = 0.0) -> None:
        self.stream = stream
        self.delay_s = delay_s
        self.seqs: list[int] = []
        self.reached = anyio.Event()
        self.target = 0

    async def run(self) -> None:
        async for chunk in self.stream:
            self.seqs.extend(_seqs(chunk))
            if self.seqs and self.seqs[-1] >= self.target:
                self.reached.set()
            if self.delay_s:
                await anyio.sleep(self.delay_s)


async def test_replay_then_live_has_no_gap_or_duplicate_at_the_seam(runtime: Runtime) -> None:
    session_id = await _new_session(runtime)
    await _append(runtime, session_id, 50, batch=7)
    reader = Reader(event_stream(runtime, session_id, 10))
    reader.target = 550
    async with anyio.create_task_group() as tg:
        tg.start_soon(reader.run)
        await _append(runtime, session_id, 500, batch=1)  # one transaction per event, while replaying
        with anyio.fail_after(10):
            await reader.reached.wait()
        tg.cancel_scope.cancel()
    assert reader.seqs == list(range(11, 551))


async def test_records_published_out_of_order_are_sent_in_order(runtime: Runtime) -> None:
    session_id = await _new_session(runtime)
    stream = event_stream(runtime, session_id, 0)
    assert await anext(stream) == KEEPALIVE
    async with runtime.db.write() as conn:
        records = await append_events(conn, session_id, [{"type": "x"}] * 8)
    # Two transactions' commits can finish in either order; publication follows.
    runtime.notifier.session_changed(session_id, records[5:])
    runtime.notifier.session_changed(session_id, records[:5])
    seen: list[int] = []
    with anyio.fail_after(5):
        while len(seen) < 8:
            seen.extend(_seqs(await anext(stream)))
    assert seen == list(range(1, 9))
    await stream.aclose()


async def test_appends_from_another_process_arrive_by_polling(runtime: Runtime, tmp_path: Path) -> None:
    session_id = await _new_session(runtime)
    reader = Reader(event_stream(runtime, session_id, 0))
    reader.target = 30
    other = Database(f"sqlite:///{tmp_path / 'cairn.db'}")  # no notifier: as if another process wrote
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader.run)
            for _ in range(3):
                async with other.write() as conn:
                    await append_events(conn, session_id, [{"type": "x"}] * 10)
            with anyio.fail_after(5):
                await reader.reached.wait()
            tg.cancel_scope.cancel()
    finally:
        await other.dispose()
    assert reader.seqs == list(range(1, 31))


async def test_deleting_the_session_ends_its_streams(runtime: Runtime) -> None:
    session_id = await _new_session(runtime)
    await _append(runtime, session_id, 3)
    chunks = []
    async with anyio.create_task_group() as tg:

        async def read() -> None:
            async for chunk in event_stream(runtime, session_id, 0):
                chunks.append(chunk)

        tg.start_soon(read)
        await until(lambda: _seqs(b"".join(chunks)) == [1, 2, 3], "the stream to replay the log", seen=lambda: chunks)
        async with runtime.db.write() as conn:
            await delete_session(conn, session_id)
        runtime.notifier.session_changed(session_id)
        await until(lambda: not runtime.notifier.subscriber_count(session_id), "the stream to end")
    assert _seqs(b"".join(chunks)) == [1, 2, 3]


async def test_slow_and_stalled_subscribers_block_neither_the_writer_nor_others(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'cairn.db'}")
    await upgrade(db)
    # A small inbox, so the stalled and the slow subscriber both overflow and must catch up from the log.
    notifier = Notifier(max_buffered=200)
    rt = build_runtime(Settings(data_dir=tmp_path, poll_interval_s=0.05), db)
    rt = replace(rt, notifier=notifier, journal=Journal(db, notifier))
    try:
        session_id = await _new_session(rt)
        total = 20_000
        stalled = event_stream(rt, session_id, 0)
        assert await anext(stalled) == KEEPALIVE  # subscribed, then never read during the appends
        fast, slow = Reader(event_stream(rt, session_id, 0)), Reader(event_stream(rt, session_id, 0), delay_s=0.02)
        fast.target = slow.target = total
        async with anyio.create_task_group() as tg:
            tg.start_soon(fast.run)
            tg.start_soon(slow.run)
            # A writer or a fast reader held up by the stalled subscriber would never get through:
            # the stalled one reads nothing until both are done.
            with anyio.fail_after(30):
                await _append(rt, session_id, total)
                await fast.reached.wait()
            # The slow one overflows its inbox while it reads and still gets everything.
            with anyio.fail_after(30):
                await slow.reached.wait()
            tg.cancel_scope.cancel()
        assert fast.seqs == slow.seqs == list(range(1, total + 1))
        assert all(s._buffered <= 200 for s in notifier._subscriptions[session_id])
        rest: list[int] = []
        with anyio.fail_after(30):
            while len(rest) < total:
                rest.extend(_seqs(await anext(stalled)))
        assert rest == list(range(1, total + 1))
        await stalled.aclose()
    finally:
        await db.dispose()
