"""The worker: claims jobs under leases and runs them, renewing each lease while it runs.

At-least-once: a job whose worker died is claimed again once its lease expires (database
clock). A worker that cannot renew a lease stops that job at once; the fencing token on
every write makes a late write from it fail anyway (style: durable queues).
"""

from __future__ import annotations

import logging
import os
import socket
import secrets

import anyio

from cairn.engine.lifecycle import RUN_TURN
from cairn.engine.runtime import Runtime
from cairn.engine.turn import TurnRunner
from cairn.errors import StoreError
from cairn.store.jobs import Job, claim_job, complete_job, release_job, renew_lease

__all__ = ["Worker"]

log = logging.getLogger(__name__)


class Worker:
    def __init__(self, runtime: Runtime, *, concurrency: int) -> None:
        self.rt = runtime
        self.concurrency = concurrency
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.runner = TurnRunner(runtime)

    async def run(self) -> None:
        """Claim and run jobs until cancelled; at most `concurrency` at a time."""
        slots = anyio.Semaphore(self.concurrency)
        async with anyio.create_task_group() as tg:
            while True:
                await slots.acquire()
                job = await self._claim()
                if job is None:
                    slots.release()
                    await self.rt.notifier.wait_job(self.rt.settings.poll_interval_s)
                    continue
                tg.start_soon(self._run_job, job, slots, name=f"job-{job.id}")

    async def _claim(self) -> Job | None:
        try:
            return await claim_job(self.rt.db, owner=self.owner, lease_s=self.rt.settings.lease_s)
        except StoreError as exc:
            log.warning("claiming a job failed: %s", exc.message)
            return None

    async def _run_job(self, job: Job, slots: anyio.Semaphore) -> None:
        try:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._keep_lease, job, scope, name=f"lease-{job.id}")
                    await self._dispatch(job)
                    tg.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            # Shutting down: hand the job back so another worker need not wait for expiry.
            with anyio.CancelScope(shield=True):
                await release_job(self.rt.db, job)
            raise
        finally:
            slots.release()

    async def _dispatch(self, job: Job) -> None:
        if job.kind == RUN_TURN:
            await self.runner.run(job)
            return
        log.error("job %d has unknown kind %r; marking it failed", job.id, job.kind)
        async with self.rt.db.write() as conn:
            await complete_job(conn, job, error=f"unknown job kind {job.kind!r}")

    async def _keep_lease(self, job: Job, scope: anyio.CancelScope) -> None:
        interval = self.rt.settings.lease_s / 3
        while True:
            await anyio.sleep(interval)
            try:
                renewed = await renew_lease(self.rt.db, job, lease_s=self.rt.settings.lease_s)
            except StoreError as exc:
                log.warning("renewing the lease of job %d failed: %s", job.id, exc.message)
                continue
            if not renewed:
                log.warning("job %d: lease lost; stopping it", job.id)
                scope.cancel()
                return
