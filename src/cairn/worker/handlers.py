"""What the worker does with each kind of job: run it, or give up on it for good.

A handler's `give_up` ends a job that keeps failing: it is parked (never claimed again) and
whatever waited on it is told, so nothing waits for ever. For a turn that means the turn
`failed` with an error event and the session moving on to its next turn or to idle.
"""

from __future__ import annotations

import logging
from typing import Protocol

import anyio

from cairn.engine.lifecycle import close_turn
from cairn.engine.loop import TurnRunner
from cairn.engine.runtime import Runtime
from cairn.states import TurnStatus
from cairn.store.jobs import Job, complete_job, park_job
from cairn.store.turns import get_turn

__all__ = ["JobHandler", "TurnJobHandler", "WorkspaceRemovalHandler"]

log = logging.getLogger(__name__)


class JobHandler(Protocol):
    async def run(self, job: Job, stopping: anyio.Event) -> None:
        """Do the job; every normal exit leaves it completed or handed back. Once `stopping`
        is set the worker drains: a handler that can stop early at a safe point hands the job
        back there."""

    async def give_up(self, job: Job, reason: str, error: str) -> None:
        """Park the job for good with its last `error`, and end what waits on it saying `reason`."""


class TurnJobHandler:
    """`run_turn` jobs: one turn of the agent loop."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.runner = TurnRunner(runtime)

    async def run(self, job: Job, stopping: anyio.Event) -> None:
        await self.runner.run(job, stopping)

    async def give_up(self, job: Job, reason: str, error: str) -> None:
        try:
            async with self.rt.journal.transaction(job.session_id) as tx:
                turn = await get_turn(tx.conn, job.turn_id) if job.turn_id is not None else None
                if turn is not None and turn.status in ("queued", "in_progress"):
                    stopped = {"code": "internal_error", "message": f"internal error: the turn was stopped because {reason}"}
                    await close_turn(tx, turn, TurnStatus.FAILED, error=stopped)
                await park_job(tx.conn, job, error=error)
        except Exception:
            # The turn's own data may be what fails; the job must still stop being retried.
            log.exception("job %d: failing its turn failed too; parking the job alone", job.id)
            async with self.rt.db.write() as conn:
                await park_job(conn, job, error=error)


class WorkspaceRemovalHandler:
    """`remove_workspace` jobs: a deleted session's workspace and snapshots go, on a worker."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    async def run(self, job: Job, stopping: anyio.Event) -> None:
        tenant = str((job.payload or {})["tenant"])
        await self.rt.environments.remove(tenant, job.session_id)
        async with self.rt.db.write() as conn:
            await complete_job(conn, job)

    async def give_up(self, job: Job, reason: str, error: str) -> None:
        # Nothing waits on a removal: its files stay until an operator looks at the parked job.
        async with self.rt.db.write() as conn:
            await park_job(conn, job, error=error)
