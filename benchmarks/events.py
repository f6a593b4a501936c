"""Event append and fan-out: events/s delivered and append→receive latency (issue 5).

Not part of the test run. For SQLite and PostgreSQL (a throwaway server), and for 1, 10
and 100 subscribers, an appender writes events through the journal (one transaction per
batch, as the turn engine's 50 ms delta flush does) while subscribers consume
`cairn.api.sse.event_stream`, the exact bytes an SSE response carries, in the same
process as the server would. Each figure is measured in three ways:

- `cairn`: the delivery path as shipped (committed records fanned out in-process; the
  log is read only to catch up);
- `log-only`: the same code with an inbox of size 0, so every subscriber reads each
  batch back from the database (the delivery path before the fan-out, for comparison);
- `memory`: a plain asyncio fan-out of the same frames with no database at all (the
  physical reference: what the event loop alone costs).

Two loads: `max` appends as fast as it can (throughput = events / time until every
subscriber has the last one); `paced` appends at a fixed rate (default 20,000 events/s
in batches of 20, one per millisecond) to measure latency below saturation. Latency is
from the start of the appending transaction to the subscriber's receipt of the frame.
`--http` adds one run over real HTTP: uvicorn serves the stream and the subscribers are
separate processes reading it with httpx.

Targets (issue 5, SQLite): at least 20,000 events/s to one subscriber, p99 under 10 ms.

Usage: .venv/bin/python benchmarks/events.py [--events 20000] [--batch 100] [--subscribers 1,10,100]
       [--databases sqlite,postgres] [--http]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio

from cairn.api.sse import event_stream, frame, sse_response
from cairn.bootstrap import build_runtime
from cairn.config import Settings
from cairn.engine.journal import Journal
from cairn.engine.notifier import Notifier
from cairn.engine.runtime import Runtime
from cairn.ids import new_session_id
from cairn.store.db import Database
from cairn.store.migrate import upgrade
from cairn.store.sessions import SessionRecord, insert_session
from cairn.testing.postgres import ThrowawayPostgres

_SEQ = re.compile(rb'"sequence_number":(\d+)')
# A typical stream delta as the engine emits it (about 230 bytes on the wire).
_PAYLOAD = {
    "type": "agent.session.turn.output_text.delta", "session_id": "", "turn_id": "turn_0123456789abcdef01234567",
    "item_id": "item_0123456789abcdef01234567", "output_index": 3, "content_index": 0, "delta": "some text",
}


@dataclass
class Receipts:
    """Per chunk: when it arrived and the sequence numbers it carried (contiguous)."""

    times: list[float] = field(default_factory=list)
    firsts: list[int] = field(default_factory=list)
    lasts: list[int] = field(default_factory=list)
    done: anyio.Event = field(default_factory=anyio.Event)

    def record(self, chunk: bytes, target: int) -> None:
        seqs = _SEQ.findall(chunk)
        if not seqs:
            return
        self.times.append(time.perf_counter())
        self.firsts.append(int(seqs[0]))
        self.lasts.append(int(seqs[-1]))
        if self.lasts[-1] >= target:
            self.done.set()


@dataclass
class Result:
    events_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float


def _summarise(receipts: list[Receipts], append_times: list[float], started: float, total: int) -> Result:
    latencies: list[float] = []
    last = started
    for r in receipts:
        expected = 1
        for received, first, final in zip(r.times, r.firsts, r.lasts):
            assert first == expected, "lost, duplicated or reordered events"
            latencies.extend((received - append_times[seq]) * 1000 for seq in range(first, final + 1))
            expected = final + 1
        assert expected == total + 1, "lost events"
        last = max(last, r.times[-1])
    # "inclusive" interpolates between the two nearest ranks, as numpy's default percentile does.
    percentiles = statistics.quantiles(latencies, n=100, method="inclusive")
    return Result(
        events_per_s=total / (last - started),
        p50_ms=percentiles[49],
        p99_ms=percentiles[98],
        max_ms=max(latencies),
    )


async def _new_session(db: Database) -> str:
    now = time.time()
    record = SessionRecord(
        id=new_session_id(), tenant="bench", status="idle", agent={"model": "scripted:x"}, environment={"type": "none"},
        environment_id="env_1", metadata={}, error=None, usage=None, last_event_seq=0, next_turn_ordinal=0,
        outputs_manifest={}, created_at=now, last_active_at=now,
    )
    async with db.write() as conn:
        await insert_session(conn, record)
    return record.id


async def _schedule(total: int, batch: int, rate: float | None, append: Callable[[int, int], Awaitable[None]]) -> None:
    """Call append(first, count) for every batch, as fast as possible or at `rate` events/s.

    The appender yields to the event loop between transactions, as the turn engine does
    (its deltas are flushed by a timer task), so subscribers in the same process run.
    """
    interval = batch / rate if rate else 0.0
    next_at = time.perf_counter()
    for first in range(1, total + 1, batch):
        delay = next_at - time.perf_counter()
        await asyncio.sleep(max(0.0, delay))
        next_at += interval
        await append(first, min(batch, total - first + 1))


async def run_cairn(rt: Runtime, subscribers: int, total: int, batch: int, rate: float | None) -> Result:
    session_id = await _new_session(rt.db)
    payload = {**_PAYLOAD, "session_id": session_id}
    append_times = [0.0] * (total + 1)
    receipts = [Receipts() for _ in range(subscribers)]

    async def subscriber(r: Receipts) -> None:
        async for chunk in event_stream(rt, session_id, 0):
            r.record(chunk, total)
            if r.done.is_set():
                return

    async def append(first: int, count: int) -> None:
        append_times[first : first + count] = [time.perf_counter()] * count
        async with rt.journal.transaction(session_id) as tx:
            tx.emit(*([payload] * count))

    async with anyio.create_task_group() as tg:
        for r in receipts:
            tg.start_soon(subscriber, r)
        while rt.notifier.subscriber_count(session_id) < subscribers:
            await asyncio.sleep(0.001)
        started = time.perf_counter()
        await _schedule(total, batch, rate, append)
        for r in receipts:
            await r.done.wait()
    return _summarise(receipts, append_times, started, total)


async def run_memory(subscribers: int, total: int, batch: int, rate: float | None) -> Result:
    """The physical reference: the same frames through plain asyncio queues, no database."""
    append_times = [0.0] * (total + 1)
    receipts = [Receipts() for _ in range(subscribers)]
    queues: list[asyncio.Queue[bytes]] = [asyncio.Queue() for _ in range(subscribers)]
    session_id = new_session_id()

    async def subscriber(r: Receipts, queue: asyncio.Queue[bytes]) -> None:
        while not r.done.is_set():
            r.record(await queue.get(), total)

    async def append(first: int, count: int) -> None:
        append_times[first : first + count] = [time.perf_counter()] * count
        chunk = b"".join(
            frame(json.dumps({"type": _PAYLOAD["type"], "event_id": f"evt_{seq}", "sequence_number": seq,
                              **{**_PAYLOAD, "session_id": session_id}}, separators=(",", ":")))
            for seq in range(first, first + count)
        )
        await asyncio.sleep(0)  # a commit's worth of yielding
        for queue in queues:
            queue.put_nowait(chunk)

    async with anyio.create_task_group() as tg:
        for r, q in zip(receipts, queues):
            tg.start_soon(subscriber, r, q)
        started = time.perf_counter()
        await _schedule(total, batch, rate, append)
        for r in receipts:
            await r.done.wait()
    return _summarise(receipts, append_times, started, total)


# -- over HTTP ------------------------------------------------------------------------

_HTTP_CONSUMER = r"""
import json, re, sys, time, httpx
url, target = sys.argv[1], int(sys.argv[2])
seq = re.compile(rb'"sequence_number":(\d+)')
out = []
with httpx.stream("GET", url, timeout=120) as response:
    print("ready", flush=True)
    for chunk in response.iter_raw():
        found = seq.findall(chunk)
        if found:
            out.append((time.perf_counter(), int(found[0]), int(found[-1])))
            if int(found[-1]) >= target:
                break
print(json.dumps(out))
"""


async def run_http(rt: Runtime, subscribers: int, total: int, batch: int, rate: float | None) -> Result:
    """Uvicorn serves `event_stream`; each subscriber is a separate process reading it with httpx."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    session_id = await _new_session(rt.db)
    payload = {**_PAYLOAD, "session_id": session_id}

    async def stream(request: Request) -> Response:
        return sse_response(event_stream(rt, session_id, 0))

    app = Starlette(routes=[Route("/events", stream)])
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    append_times = [0.0] * (total + 1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        while not server.started:
            await asyncio.sleep(0.01)
        consumers = [
            await asyncio.create_subprocess_exec(
                sys.executable, "-c", _HTTP_CONSUMER, f"http://127.0.0.1:{port}/events", str(total),
                stdout=subprocess.PIPE,
            )
            for _ in range(subscribers)
        ]
        for consumer in consumers:
            assert consumer.stdout is not None
            assert (await consumer.stdout.readline()).strip() == b"ready"
        while rt.notifier.subscriber_count(session_id) < subscribers:
            await asyncio.sleep(0.001)

        async def append(first: int, count: int) -> None:
            append_times[first : first + count] = [time.perf_counter()] * count
            async with rt.journal.transaction(session_id) as tx:
                tx.emit(*([payload] * count))

        started = time.perf_counter()
        await _schedule(total, batch, rate, append)
        receipts = []
        for consumer in consumers:
            out, _ = await consumer.communicate()
            r = Receipts()
            for t, first, last in json.loads(out.decode().splitlines()[-1]):
                r.times.append(t)
                r.firsts.append(first)
                r.lasts.append(last)
            receipts.append(r)
        server.should_exit = True
    return _summarise(receipts, append_times, started, total)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- driver ---------------------------------------------------------------------------


@asynccontextmanager
async def _runtime(url: str, data_dir: Path, *, log_only: bool) -> AsyncIterator[Runtime]:
    db = Database(url)
    await upgrade(db)
    rt = build_runtime(Settings(data_dir=data_dir), db)
    if log_only:
        notifier = Notifier(max_buffered=0)
        rt = replace(rt, notifier=notifier, journal=Journal(db, notifier))
    try:
        yield rt
    finally:
        await db.dispose()


def _row(label: str, result: Result) -> str:
    return f"  {label:<44} {result.events_per_s:>12,.0f} {result.p50_ms:>9.2f} {result.p99_ms:>9.2f} {result.max_ms:>9.2f}"


async def main(args: argparse.Namespace) -> None:
    counts = [int(n) for n in args.subscribers.split(",")]
    header = f"  {'run':<44} {'events/s':>12} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}"
    print(f"{args.events:,} events of ~230 bytes, batches of {args.batch}; paced load {args.rate:,.0f} events/s "
          f"in batches of {args.paced_batch}; {os.cpu_count()} CPUs")
    for database in args.databases.split(","):
        pg = None
        root = Path(tempfile.mkdtemp(prefix="cairn-bench-events-"))
        try:
            if database == "postgres":
                pg = ThrowawayPostgres()
                pg.start()
            print(f"\n{database}\n{header}")
            for n in counts:
                for mode in ("cairn", "log-only"):
                    if mode == "log-only" and n > 10:
                        continue  # every subscriber reading every batch back: too slow to be worth waiting for
                    for load, rate, batch in (("max", None, args.batch), ("paced", args.rate, args.paced_batch)):
                        url = pg.create_database(f"b_{secrets.token_hex(4)}") if pg else f"sqlite:///{root / f'{mode}-{n}-{load}.db'}"
                        async with _runtime(url, root, log_only=mode == "log-only") as rt:
                            result = await run_cairn(rt, n, args.events, batch, rate)
                        print(_row(f"{mode} {load}, {n} subscriber(s)", result), flush=True)
                if args.http and n <= 10:
                    url = pg.create_database(f"b_{secrets.token_hex(4)}") if pg else f"sqlite:///{root / f'http-{n}.db'}"
                    async with _runtime(url, root, log_only=False) as rt:
                        result = await run_http(rt, n, args.events, args.batch, None)
                    print(_row(f"cairn max over HTTP, {n} client process(es)", result), flush=True)
        finally:
            if pg is not None:
                pg.stop()
    print(f"\nmemory (no database)\n{header}")
    for n in counts:
        for load, rate, batch in (("max", None, args.batch), ("paced", args.rate, args.paced_batch)):
            print(_row(f"memory {load}, {n} subscriber(s)", await run_memory(n, args.events, batch, rate)), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100, help="events per transaction under the max load")
    parser.add_argument("--rate", type=float, default=20_000, help="events/s of the paced load")
    parser.add_argument("--paced-batch", type=int, default=20, help="events per transaction under the paced load")
    parser.add_argument("--subscribers", default="1,10,100")
    parser.add_argument("--databases", default="sqlite,postgres")
    parser.add_argument("--http", action="store_true", help="also measure over HTTP with subscriber processes")
    asyncio.run(main(parser.parse_args()))
