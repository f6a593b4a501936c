"""The worker: claims jobs under leases and runs them, renewing each lease while it runs.

At-least-once: a job whose worker died is claimed again once its lease expires (database
clock). A worker that cannot renew a lease stops that job at once; the fencing token on
every write makes a late write from it fail anyway (style: durable queues).

No job can stop the worker (issue 19): a job that raises is logged once with its id and
queued again after a growing delay; after `Settings.job_max_attempts` attempts (raised, or
interrupted by a dead worker) its handler gives up on it: the job is parked and its turn
failed. The loop and every other job carry on.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket

import anyio

from cairn.engine.lifecycle import REMOVE_WORKSPACE, RUN_TURN
from cairn.engine.runtime import Runtime
from cairn.store.jobs import Job, claim_job, park_job, release_job, renew_lease, retry_job
from cairn.worker.handlers import JobHandler, TurnJobHandler, WorkspaceRemovalHandler

__all__ = ["Worker"]

log = logging.getLogger(__name__)

_MAX_RETRY_DELAY_S = 300.0
_MAX_ERROR_CHARS = 2000


def _describe(exc: BaseException) -> str:
    """The failure as stored on the job: bounded, and always storable text."""
    text = f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS]
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


class Worker:
    def __init__(self, runtime: Runtime, *, concurrency: int) -> None:
        self.rt = runtime
        self.concurrency = concurrency
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.handlers: dict[str, JobHandler] = {
            RUN_TURN: TurnJobHandler(runtime),
            REMOVE_WORKSPACE: WorkspaceRemovalHandler(runtime),
        }
        self._slots = anyio.Semaphore(concurrency)
        self._draining = anyio.Event()
        self._running = 0
        self._idle = anyio.Event()
        self._idle.set()

    async def run(self) -> None:
        """Claim and run jobs until cancelled or drained; at most `concurrency` at a time."""
        async with anyio.create_task_group() as tg:
            while not self._draining.is_set():
                await self._slots.acquire()
                job = None if self._draining.is_set() else await self._claim()
                if job is None:
                    self._slots.release()
                    if not self._draining.is_set():
                        await self.rt.notifier.wait_job(self.rt.settings.poll_interval_s)
                    continue
                self._running += 1
                self._idle = anyio.Event()
                tg.start_soon(self._run_job, job, name=f"job-{job.id}")

    async def drain(self, grace_s: float) -> bool:
        """Claim no more jobs; wait up to `grace_s` for the running ones to end. True if they did."""
        self._draining.set()
        with anyio.move_on_after(grace_s):
            await self._idle.wait()
            return True
        return False

    async def _claim(self) -> Job | None:
        try:
            return await claim_job(self.rt.db, owner=self.owner, lease_s=self.rt.settings.lease_s)
        except Exception:
            log.exception("claiming a job failed; trying again")
            return None

    async def _run_job(self, job: Job) -> None:
        try:
            handler = self.handlers.get(job.kind)
            if handler is None:
                log.error("job %d has unknown kind %r; parking it", job.id, job.kind)
                await self._park_unknown(job)
                return
            if job.attempts > self.rt.settings.job_max_attempts:
                # Every earlier claim ended with its worker gone (a crash, a kill): stop here.
                reason = f"it was interrupted {job.attempts - 1} times without finishing"
                log.error("job %d (%s): %s; giving up on it", job.id, job.kind, reason)
                await self._give_up(handler, job, reason, reason)
                return
            try:
                await self._run_leased(handler, job)
            except anyio.get_cancelled_exc_class():
                # Shutting down: hand the job back so another worker need not wait for expiry.
                with anyio.CancelScope(shield=True):
                    await release_job(self.rt.db, job)
                raise
            except Exception as exc:
                await self._after_failure(handler, job, exc)
        finally:
            self._running -= 1
            if self._running == 0:
                self._idle.set()
            self._slots.release()

    async def _run_leased(self, handler: JobHandler, job: Job) -> None:
        try:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._keep_lease, job, scope, name=f"lease-{job.id}")
                    await handler.run(job, self._draining)
                    tg.cancel_scope.cancel()
        except ExceptionGroup as group:
            # The lease task never raises: the one failure inside is the handler's own.
            raise (group.exceptions[0] if len(group.exceptions) == 1 else group) from None

    async def _after_failure(self, handler: JobHandler, job: Job, exc: Exception) -> None:
        log.error(
            "job %d (%s, session %s, turn %s) failed on attempt %d of %d",
            job.id, job.kind, job.session_id, job.turn_id, job.attempts, self.rt.settings.job_max_attempts, exc_info=exc,
        )
        error = _describe(exc)
        with anyio.CancelScope(shield=True):
            try:
                if job.attempts >= self.rt.settings.job_max_attempts:
                    await self._give_up(handler, job, f"it failed {job.attempts} times (last: {type(exc).__name__})", error)
                    return
                delay_s = min(self.rt.settings.job_retry_delay_s * 2 ** (job.attempts - 1), _MAX_RETRY_DELAY_S)
                await retry_job(self.rt.db, job, delay_s=delay_s, error=error)
            except Exception:
                # The lease expires and the next claim counts one more attempt: still bounded.
                log.exception("job %d: recording its failure failed too", job.id)

    async def _give_up(self, handler: JobHandler, job: Job, reason: str, error: str) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await handler.give_up(job, reason, error)
            except Exception:
                # The lease expires and the next claim gives up again: the job never runs.
                log.exception("job %d: giving up on it failed", job.id)

    async def _park_unknown(self, job: Job) -> None:
        try:
            async with self.rt.db.write() as conn:
                await park_job(conn, job, error=f"unknown job kind {job.kind!r}")
        except Exception:
            log.exception("job %d: parking it failed", job.id)

    async def _keep_lease(self, job: Job, scope: anyio.CancelScope) -> None:
        interval = self.rt.settings.lease_s / 3
        while True:
            await anyio.sleep(interval)
            try:
                renewed = await renew_lease(self.rt.db, job, lease_s=self.rt.settings.lease_s)
            except Exception:
                log.exception("renewing the lease of job %d failed; trying again", job.id)
                continue
            if not renewed:
                log.warning("job %d: lease lost; stopping it", job.id)
                scope.cancel()
                return
