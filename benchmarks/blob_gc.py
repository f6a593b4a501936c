"""Blob garbage collection: sweep time over a large blob directory, and event-loop lag meanwhile.

Not part of the test run. Builds a blob directory of `--blobs` small blobs (all aged past
the grace period) with one artifact row per blob, deletes `--deleted` percent of the rows,
and measures, in the same run:

- `walk`: a plain `os.scandir` + `lstat` of every blob file in one thread, no database: the
  floor for any sweep that has to look at every file;
- `cairn steady`: `collect_blob_garbage` when nothing is deletable (every row still there);
- `cairn sweep`: the sweep that frees the deleted rows' blobs.

While each Cairn sweep runs, a ticker on the same event loop sleeps 5 ms at a time and
records how late it wakes: the worst lag shows whether the sweep ever blocks the loop
(compared with the ticker's worst lag on an idle loop, measured first).

Usage: .venv/bin/python benchmarks/blob_gc.py [--blobs 100000] [--deleted 10] [--repeats 3]
       [--databases sqlite,postgres]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import anyio
import sqlalchemy as sa
from _loop_lag import idle_loop_lag_ms, with_loop_lag

from cairn.blobs import BlobStore
from cairn.engine.blob_gc import collect_blob_garbage
from cairn.store.db import Database
from cairn.store.migrate import upgrade
from cairn.store.tables import artifacts, sessions
from cairn.testing.postgres import ThrowawayPostgres


def _make_blobs(root: Path, count: int) -> list[str]:
    old = time.time() - 7200
    digests = []
    for i in range(count):
        content = f"blob {i}\n".encode()
        sha256 = hashlib.sha256(content).hexdigest()
        path = root / sha256[:2] / sha256[2:]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        os.utime(path, (old, old))
        digests.append(sha256)
    return digests


async def _insert_rows(db: Database, digests: list[str]) -> None:
    now = time.time()
    async with db.write() as conn:
        await conn.execute(sa.insert(sessions).values(
            id="sess_bench", tenant="bench", status="idle", agent={}, environment={}, environment_id="env",
            metadata={}, outputs_manifest={}, created_at=now, last_active_at=now,
        ))
    for start in range(0, len(digests), 5000):
        rows = [
            {"id": f"art_{start + i}", "session_id": "sess_bench", "tenant": "bench", "turn_id": f"turn_{start + i}",
             "environment_id": "env", "path": "/workspace/outputs/x", "size_bytes": 10, "sha256": d, "created_at": now}
            for i, d in enumerate(digests[start : start + 5000])
        ]
        async with db.write() as conn:
            await conn.execute(sa.insert(artifacts), rows)


def _walk(root: Path) -> int:
    seen = 0
    for prefix in os.scandir(root):
        if prefix.is_dir(follow_symlinks=False):
            for entry in os.scandir(prefix.path):
                entry.stat(follow_symlinks=False)
                seen += 1
    return seen


async def _run(url: str, args: argparse.Namespace) -> None:
    db = Database(url)
    await upgrade(db)
    with tempfile.TemporaryDirectory(prefix="cairn-blob-gc-") as tmp:
        blobs = BlobStore(Path(tmp) / "blobs")
        digests = _make_blobs(blobs.root, args.blobs)
        await _insert_rows(db, digests)
        if not db.is_sqlite:
            async with db.write() as conn:
                # What autovacuum does to a table this size soon after a bulk load: without
                # statistics, PostgreSQL scans the whole table for every batch.
                await conn.execute(sa.text("ANALYZE artifacts"))
        # The setup's own garbage would otherwise fall due in the first sweep measured: a
        # full collection of Python's cyclic garbage collector pauses the loop ~100 ms here.
        gc.collect()
        idle_lag = await idle_loop_lag_ms()
        walks, steady, steady_lag = [], [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            assert _walk(blobs.root) == args.blobs
            walks.append(time.perf_counter() - start)
            elapsed, lag, report = await with_loop_lag(lambda: collect_blob_garbage(db, blobs, grace_s=3600))
            assert report.blobs_deleted == 0 and report.blobs_scanned == args.blobs
            steady.append(elapsed)
            steady_lag.append(lag)
        doomed = digests[: args.blobs * args.deleted // 100]
        async with db.write() as conn:
            await conn.execute(sa.delete(artifacts).where(artifacts.c.sha256.in_(doomed)))
        elapsed, lag, report = await with_loop_lag(lambda: collect_blob_garbage(db, blobs, grace_s=3600))
        assert report.blobs_deleted == len(doomed), report
    await db.dispose()
    walk_s, steady_s = statistics.median(walks), statistics.median(steady)
    print(f"  idle loop      worst lag {idle_lag:5.1f} ms (the ticker alone, for scale)")
    print(f"  walk (floor)   {walk_s * 1000:8.0f} ms   {args.blobs / walk_s:9.0f} blobs/s")
    print(f"  cairn steady   {steady_s * 1000:8.0f} ms   {args.blobs / steady_s:9.0f} blobs/s   "
          f"worst loop lag {statistics.median(steady_lag):5.1f} ms   ratio to walk {steady_s / walk_s:4.1f}")
    print(f"  cairn sweep    {elapsed * 1000:8.0f} ms   {len(doomed)} blobs freed ({len(doomed) / elapsed:.0f}/s)   "
          f"worst loop lag {lag:5.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blobs", type=int, default=100_000)
    parser.add_argument("--deleted", type=int, default=10, help="percent of rows deleted before the freeing sweep")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--databases", default="sqlite")
    args = parser.parse_args()
    print(f"{args.blobs} blobs, {args.deleted}% deleted, load average {os.getloadavg()[0]:.1f}")
    for kind in args.databases.split(","):
        print(kind)
        if kind == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                anyio.run(_run, f"sqlite:///{tmp}/cairn.db", args)
            continue
        with ThrowawayPostgres() as server:
            anyio.run(_run, server.create_database(f"bench_{secrets.token_hex(4)}"), args)


if __name__ == "__main__":
    main()
