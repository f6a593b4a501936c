"""Encryption at rest (issue 17): what sealing costs a run-state blob, and a pause and a resume.

Not part of the test run. Two measurements, for run-state blobs of 10 KB and 1 MB (JSON,
random text, as a large review snapshot would be):

- throughput: `Envelope.seal` and `Envelope.open` alone (AES-256-GCM under a fresh data key,
  the data key wrapped by the local keyring's master key), per operation and in MB/s;
- per pause and per resume, through the real store path, interleaved in one run on SQLite (a
  file, WAL) and, with `--postgres`, a throwaway PostgreSQL:
  - `clear`: a pause stores the approval with the blob in its clear columns (as before
    sealing: `insert_approval` in a write transaction), a resume reads it back
    (`get_call_approval` in a read transaction);
  - `sealed`: what Cairn does: the pause seals the blob for the approval and stores its data
    key in the same transaction (`seal_state` + `insert_approval`), the resume reads the
    row, its data key, and opens it (`open_state`).

The added cost is `sealed - clear` (the medians' and the p99s' differences); target (issue
17): under 1 ms added for a 10 KB state.

Usage: .venv/bin/python benchmarks/crypto.py [--rounds 300] [--postgres]
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from cairn.config import Settings
from cairn.durable.crypto import Envelope, SealScope
from cairn.durable.keyring import LocalKeyring
from cairn.durable.sealing import Sealer
from cairn.engine.approvals.sealed import open_state, seal_state
from cairn.ids import new_approval_id
from cairn.states import ApprovalStatus
from cairn.store.approvals import ApprovalRecord, get_call_approval, insert_approval
from cairn.store.db import Database
from cairn.store.migrate import upgrade
from cairn.testing.postgres import ThrowawayPostgres

SIZES = {"10 KB": 10 * 1024, "1 MB": 1024 * 1024}


def _review(size: int) -> dict[str, Any]:
    """A JSON review snapshot of about `size` bytes of random text."""
    return {"patch": base64.b64encode(os.urandom(size * 3 // 4)).decode()[:size]}


def _approval(review: dict[str, Any], index: int) -> ApprovalRecord:
    approval_id = new_approval_id()
    return ApprovalRecord(
        id=approval_id, tenant="bench", session_id="sess_bench", turn_id="turn_bench", call_id=f"call_{index}_{approval_id}",
        tool_name="apply_patch", review=review, summary="apply_patch(…)", arguments_digest="d" * 64,
        agent_version="bench/v1", agent_revision="rev", approvers=["approver"],
        run_state={"turn_id": "turn_bench", "call_id": f"call_{index}", "agent_version": "bench/v1", "agent_revision": "rev",
                   "server_label": "bench"},
        run_state_version=2, status=ApprovalStatus.PENDING, reason=None, message=None, created_at=0.0, expires_at=0.0,
    )


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _line(label: str, values: list[float], extra: str = "") -> None:
    print(f"{label:<34} p50 {statistics.median(values):8.3f} ms   p99 {_p(values, 0.99):8.3f} ms{extra}")


async def _timed(times: list[float], step: Callable[[], Awaitable[object]], *, keep: bool) -> None:
    begin = time.perf_counter()
    await step()
    if keep:
        times.append((time.perf_counter() - begin) * 1000)


async def throughput(keys: LocalKeyring, rounds: int) -> None:
    envelope = Envelope(keys)
    scope = SealScope("bench", "approval", "apr_bench")
    for name, size in SIZES.items():
        plaintext = os.urandom(size)
        seals: list[float] = []
        opens: list[float] = []
        count = rounds if size < 100_000 else max(20, rounds // 10)
        for index in range(count + count // 10):
            keep = index >= count // 10
            begin = time.perf_counter()
            sealed = await envelope.seal(plaintext, scope)
            middle = time.perf_counter()
            await envelope.open(sealed.blob, sealed.data_key.key, scope)
            if keep:
                seals.append((middle - begin) * 1000)
                opens.append((time.perf_counter() - middle) * 1000)
        for label, values in (("seal", seals), ("open", opens)):
            rate = size / (statistics.median(values) / 1000) / 1e6
            _line(f"envelope {label} {name}", values, f"   {rate:8.0f} MB/s")
    print(flush=True)


async def pause_resume(url: str, sealer: Sealer, rounds: int, label: str) -> None:
    db = Database(url)
    try:
        await upgrade(db)
        for name, size in SIZES.items():
            review = _review(size)
            times: dict[str, list[float]] = {"clear pause": [], "sealed pause": [], "clear resume": [], "sealed resume": []}
            count = rounds if size < 100_000 else max(20, rounds // 10)
            for index in range(count + count // 10):
                keep = index >= count // 10  # the first tenth warms up
                clear, sealed = _approval(review, index), _approval(review, index)

                async def pause_clear(record: ApprovalRecord = clear) -> None:
                    async with db.write() as conn:
                        await insert_approval(conn, record, ttl_s=3600)

                async def pause_sealed(record: ApprovalRecord = sealed) -> None:
                    async with db.write() as conn:
                        await insert_approval(conn, await seal_state(sealer, conn, record), ttl_s=3600)

                async def resume_clear(record: ApprovalRecord = clear, review: dict[str, Any] = review) -> None:
                    async with db.read() as conn:
                        found = await get_call_approval(conn, record.turn_id, record.call_id)
                    assert found is not None and found.review == review

                async def resume_sealed(record: ApprovalRecord = sealed, review: dict[str, Any] = review) -> None:
                    async with db.read() as conn:
                        found = await get_call_approval(conn, record.turn_id, record.call_id)
                        assert found is not None
                        opened = await open_state(sealer, conn, found)
                    assert opened.review == review

                await _timed(times["clear pause"], pause_clear, keep=keep)
                await _timed(times["sealed pause"], pause_sealed, keep=keep)
                await _timed(times["clear resume"], resume_clear, keep=keep)
                await _timed(times["sealed resume"], resume_sealed, keep=keep)
            for what, values in times.items():
                _line(f"{label} {what} {name}", values, f"   n={len(values)}")
            for step in ("pause", "resume"):
                sealed_t, clear_t = times[f"sealed {step}"], times[f"clear {step}"]
                p50 = statistics.median(sealed_t) - statistics.median(clear_t)
                p99 = _p(sealed_t, 0.99) - _p(clear_t, 0.99)
                verdict = f"   (target < 1 ms: {'met' if p50 < 1 else 'NOT met'})" if size < 100_000 else ""
                print(f"{label + ' ' + step + ' ' + name + ' sealed - clear':<34} added p50 {p50:8.3f} ms   p99 {p99:8.3f} ms{verdict}")
            print(flush=True)
    finally:
        await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300, help="operations per size for 10 KB (a tenth of them for 1 MB)")
    parser.add_argument("--postgres", action="store_true", help="also measure on a throwaway PostgreSQL")
    args = parser.parse_args()
    print(f"{args.rounds} rounds, on {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}\n")
    root = Path(tempfile.mkdtemp(prefix="cairn-bench-crypto-"))
    try:
        keys = LocalKeyring.from_settings(Settings(data_dir=root))
        sealer = Sealer(keys)
        anyio.run(throughput, keys, args.rounds)
        anyio.run(pause_resume, f"sqlite:///{root / 'cairn.db'}", sealer, args.rounds, "SQLite")
        if args.postgres:
            with ThrowawayPostgres() as server:
                anyio.run(pause_resume, server.create_database("bench_crypto"), sealer, args.rounds, "PostgreSQL")
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
