"""The idempotency ledger (issue 16): what it adds to one side-effecting call.

Not part of the test run. Three ways to run the same call, interleaved in one run, each
printed with p50 and p99 on SQLite (a file, WAL) and, with `--postgres`, a throwaway
PostgreSQL:

- `bare`: the tool (an async function returning a string) and the transaction that records
  its result, which every call pays anyway (here: one row inserted in a write transaction);
- `ledger`: what Cairn's reserve stage does around it: the claim (`claim_operation`, its own
  write transaction: INSERT … ON CONFLICT DO NOTHING), the move to executing
  (`start_execution`, committed before the tool starts), the tool, and the record
  transaction with the entry settled in it (`settle_entry`: succeeded, with its result
  sealed for the entry as the engine stores it, `store_output`: a data key row and AES-GCM);
  every step fenced by a real job claim's lease token, as in a worker;
- `dedup`: the seed's plain dedup table: `BEGIN IMMEDIATE` (a write transaction) + INSERT of
  the key, committed, then the tool and the record transaction; no states, no lease, no
  fencing, no result.

The ledger's added cost is `ledger - bare` per call (the medians' and the p99s' differences);
targets (issue 16): under 3 ms p50 on SQLite, under 10 ms on PostgreSQL.

The comparison with the OpenAI Agents SDK (one approved state replayed on two workers: SDK 2
executions, Cairn 1) is a test, run with the suite: tests/e2e/test_ledger.py.

Usage: .venv/bin/python benchmarks/ledger.py [--calls 2000] [--postgres]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import sqlalchemy as sa

from cairn.blobs import BlobStore
from cairn.config import Settings
from cairn.durable.keyring import LocalKeyring
from cairn.durable.sealing import Sealer
from cairn.engine.ledger.results import store_output
from cairn.states import LedgerStatus
from cairn.store.db import Connection, Database
from cairn.store.jobs import Job, claim_job, enqueue_job
from cairn.store.ledger import Operation, claim_operation, settle_entry, start_execution
from cairn.store.migrate import upgrade
from cairn.testing.postgres import ThrowawayPostgres

_scratch = sa.MetaData()
# Where the record transaction writes the call's result (what every call pays).
_results = sa.Table("bench_results", _scratch, sa.Column("id", sa.String(80), primary_key=True), sa.Column("output", sa.Text))
# The seed's dedup table: a key, unique.
_dedup = sa.Table("bench_dedup", _scratch, sa.Column("key", sa.String(80), primary_key=True))


async def _tool(release: str) -> str:
    return f"deployed:{release}"


async def _record(conn: Connection, key: str, output: str) -> None:
    await conn.execute(sa.insert(_results).values(id=key, output=output))


@dataclass(frozen=True, slots=True)
class _Bench:
    """What every way runs against: the database, a real job claim, where results are kept."""

    db: Database
    job: Job
    sealer: Sealer
    blobs: BlobStore


async def bare(bench: _Bench, key: str) -> None:
    output = await _tool(key)
    async with bench.db.write() as conn:
        await _record(conn, key, output)


async def ledger(bench: _Bench, key: str) -> None:
    db, token = bench.db, bench.job.lease_token
    operation = Operation(operation_key=key, tenant="bench", session_id="sess_bench", turn_id="turn_bench", call_id=key,
                          approval_id=None, tool_name="deploy", arguments_digest="d" * 64)
    async with db.write() as conn:
        claim = await claim_operation(conn, operation, token=token, now=db.now(), max_attempts=3)
    async with db.write() as conn:
        running = await start_execution(conn, claim.entry, token=token)
    output = await _tool(key)
    async with db.write() as conn:
        stored, blob = await store_output(conn, bench.blobs, bench.sealer, running, output, inline_bytes=64 * 1024)
        await settle_entry(conn, running, LedgerStatus.SUCCEEDED, token=token, result=stored, result_blob=blob)
        await _record(conn, key, output)


async def dedup(bench: _Bench, key: str) -> None:
    async with bench.db.write() as conn:
        await conn.execute(sa.insert(_dedup).values(key=key))
    output = await _tool(key)
    async with bench.db.write() as conn:
        await _record(conn, key, output)


_WAYS: dict[str, Callable[[_Bench, str], Awaitable[None]]] = {"bare": bare, "ledger": ledger, "dedup": dedup}


async def measure(url: str, root: Path, calls: int) -> dict[str, list[float]]:
    """Milliseconds per call for each way, interleaved so that load drifts hit them alike."""
    db = Database(url)
    settings = Settings(data_dir=root)
    try:
        await upgrade(db)
        async with db.write() as conn:
            for table in _scratch.sorted_tables:
                await conn.execute(sa.schema.CreateTable(table))
            await enqueue_job(conn, kind="run_turn", session_id="sess_bench", turn_id="turn_bench")
        job = await claim_job(db, owner="bench", lease_s=3600)
        assert job is not None
        bench = _Bench(db, job, Sealer(LocalKeyring.from_settings(settings)), BlobStore(settings.blobs_dir))
        times: dict[str, list[float]] = {name: [] for name in _WAYS}
        for index in range(calls + calls // 10):
            for name, way in _WAYS.items():
                key = f"op_{name}_{index}_{secrets.token_hex(4)}"
                begin = time.perf_counter()
                await way(bench, key)
                if index >= calls // 10:  # the first tenth warms up
                    times[name].append((time.perf_counter() - begin) * 1000)
        return times
    finally:
        await db.dispose()


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(label: str, times: dict[str, list[float]], target_ms: float) -> None:
    for name, values in times.items():
        print(f"{label:<11} {name:<7} p50 {statistics.median(values):7.3f} ms   p99 {_p(values, 0.99):7.3f} ms   n={len(values)}")
    for name in ("ledger", "dedup"):
        p50 = statistics.median(times[name]) - statistics.median(times["bare"])
        p99 = _p(times[name], 0.99) - _p(times["bare"], 0.99)
        verdict = f"   (target p50 < {target_ms:g} ms: {'met' if p50 < target_ms else 'NOT met'})" if name == "ledger" else ""
        print(f"{label:<11} {name} - bare: added p50 {p50:7.3f} ms   p99 {p99:7.3f} ms{verdict}")
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--postgres", action="store_true", help="also measure on a throwaway PostgreSQL")
    args = parser.parse_args()
    print(f"{args.calls} calls per way, on {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}\n")
    root = Path(tempfile.mkdtemp(prefix="cairn-bench-ledger-"))
    try:
        report("SQLite", anyio.run(measure, f"sqlite:///{root / 'cairn.db'}", root, args.calls), 3)
        if args.postgres:
            with ThrowawayPostgres() as server:
                report("PostgreSQL", anyio.run(measure, server.create_database("bench_ledger"), root, args.calls), 10)
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
