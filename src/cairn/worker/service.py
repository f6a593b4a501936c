"""Everything a process that runs turns keeps going in the background, each task supervised.

The job loop, the suspension of idle workspaces and the periodic garbage collection of
snapshots and artifact blobs run in the caller's task group; none of them can stop another
or stop for good (`cairn.worker.background`).
"""

from __future__ import annotations

from functools import partial

from anyio.abc import TaskGroup

from cairn.engine.blob_gc import sweep_blob_garbage
from cairn.engine.idle import apply_snapshot_retention, idle_check_interval_s, suspend_idle_sessions
from cairn.engine.runtime import Runtime
from cairn.worker.background import run_periodically, supervise
from cairn.worker.runner import Worker

__all__ = ["start_worker_tasks"]


def start_worker_tasks(tg: TaskGroup, runtime: Runtime, *, concurrency: int) -> None:
    """Start the job loop with `concurrency` slots and the periodic care of workspaces and blobs."""
    settings = runtime.settings
    tg.start_soon(supervise, "worker", Worker(runtime, concurrency=concurrency).run, name="worker")
    tg.start_soon(
        run_periodically, "idle-sessions", idle_check_interval_s(runtime), partial(suspend_idle_sessions, runtime),
        name="idle-sessions",
    )
    tg.start_soon(
        run_periodically, "snapshot-gc", settings.snapshot_gc_interval_s, partial(apply_snapshot_retention, runtime),
        name="snapshot-gc",
    )
    if settings.blob_gc_interval_s > 0:
        tg.start_soon(
            run_periodically, "blob-gc", settings.blob_gc_interval_s, partial(sweep_blob_garbage, runtime), name="blob-gc"
        )
