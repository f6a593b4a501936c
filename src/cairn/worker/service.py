"""Everything a process that runs turns keeps going in the background, each task supervised.

The job loop, the suspension of idle workspaces, the expiry of approvals nobody decided in
time, the retention sweep of the idempotency ledger, the lifetimes of sealed state (and the
data keys a crash left), and the periodic garbage collection of snapshots and artifact blobs run in the caller's task group; none of them can stop another
or stop for good (`cairn.worker.background`). `drain` is the graceful half of a shutdown:
no new job is claimed, and running ones get a grace period to end before the caller cancels
what is left (a cancelled job is handed back at once, for another worker to resume).
"""

from __future__ import annotations

from functools import partial

from anyio.abc import TaskGroup

from cairn.engine.approvals import expire_approvals
from cairn.engine.blob_gc import sweep_blob_garbage
from cairn.engine.egress_events import record_egress_events
from cairn.engine.idle import apply_snapshot_retention, idle_check_interval_s, suspend_idle_sessions
from cairn.engine.ledger import sweep_ledger
from cairn.engine.retention import sweep_sealed_state
from cairn.engine.runtime import Runtime
from cairn.worker.background import run_periodically, supervise
from cairn.worker.runner import Worker

__all__ = ["WorkerService", "start_worker_tasks"]


class WorkerService:
    """The job loop and the periodic care of workspaces and blobs of one process."""

    def __init__(self, runtime: Runtime, *, concurrency: int) -> None:
        self.runtime = runtime
        self.worker = Worker(runtime, concurrency=concurrency)

    def start(self, tg: TaskGroup) -> None:
        rt = self.runtime
        settings = rt.settings
        tg.start_soon(supervise, "worker", self.worker.run, name="worker")
        tg.start_soon(
            run_periodically, "idle-sessions", idle_check_interval_s(rt), partial(suspend_idle_sessions, rt), name="idle-sessions"
        )
        tg.start_soon(
            run_periodically, "snapshot-gc", settings.snapshot_gc_interval_s, partial(apply_snapshot_retention, rt),
            name="snapshot-gc",
        )
        tg.start_soon(
            run_periodically, "approval-expiry", settings.approval_expiry_check_s, partial(expire_approvals, rt.journal),
            name="approval-expiry",
        )
        tg.start_soon(
            run_periodically, "ledger-sweep", settings.ledger_sweep_interval_s, partial(sweep_ledger, rt), name="ledger-sweep"
        )
        tg.start_soon(
            run_periodically, "sealed-sweep", settings.sealed_sweep_interval_s, partial(sweep_sealed_state, rt),
            name="sealed-sweep",
        )
        tg.start_soon(supervise, "egress-events", partial(record_egress_events, rt), name="egress-events")
        if settings.blob_gc_interval_s > 0:
            tg.start_soon(run_periodically, "blob-gc", settings.blob_gc_interval_s, partial(sweep_blob_garbage, rt), name="blob-gc")

    async def drain(self, grace_s: float) -> bool:
        """Claim nothing more and wait up to `grace_s` for running jobs to end; True if they all did."""
        return await self.worker.drain(grace_s)


def start_worker_tasks(tg: TaskGroup, runtime: Runtime, *, concurrency: int) -> WorkerService:
    """Start a `WorkerService` with `concurrency` job slots in `tg`."""
    service = WorkerService(runtime, concurrency=concurrency)
    service.start(tg)
    return service
