"""The job queue: a table with leases, claimed at-least-once by any worker process.

A claim is a compare-and-set: candidates are selected (with `FOR UPDATE SKIP LOCKED` on
PostgreSQL, and the candidate's session locked so that two jobs of one session are never
claimed at once; SQLite's `BEGIN IMMEDIATE` already serializes writers), then updated with a
WHERE clause that re-states the claimable condition, and only returned rows count. Every
claim gets a fresh `lease_token`; renewals and completions name it, so a worker whose
lease was taken over can no longer touch the job (fencing). Lease times come from the
database clock.

A job that raised is queued again after a delay (`retry_job`, `run_after`) or, once it has
used its attempts, `parked`: kept for inspection, never claimed again (issue 19). A job
handed back on shutdown (`release_job`) does not use up an attempt.

Every status write is built by `_move`, which checks the move against
`cairn.states.JOB_TRANSITIONS` and makes the UPDATE conditional on the states it moves from.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from cairn.states import JOB_TRANSITIONS, JobStatus
from cairn.store.db import Connection, Database
from cairn.store.tables import jobs

__all__ = [
    "Job",
    "claim_job",
    "complete_job",
    "enqueue_job",
    "has_claimable_job",
    "park_job",
    "release_job",
    "renew_lease",
    "retry_job",
]

# A job's first token is (id << 20) + 1 and every claim adds one: unique across all claims of
# all jobs, so a turn fenced by one job's token can never be written by a stale claim of
# another job, nor by an earlier claim of the same one (attempts, which a release gives
# back, play no part in it).
_TOKEN_SHIFT = 20
# The key space of the per-session claim locks (two-int advisory locks: apart from every
# one-bigint advisory lock, such as the blob sweep's).
_CLAIM_LOCK_SPACE = 0x636A


@dataclass(frozen=True, slots=True)
class Job:
    id: int
    kind: str
    session_id: str
    turn_id: str | None
    attempts: int
    lease_token: int
    payload: Mapping[str, Any] | None = None


async def enqueue_job(
    conn: Connection, *, kind: str, session_id: str, turn_id: str | None, payload: Mapping[str, Any] | None = None
) -> bool:
    """Queue a job unless the same work is already queued or running; True if queued."""
    duplicate = sa.select(jobs.c.id).where(
        jobs.c.kind == kind,
        jobs.c.session_id == session_id,
        jobs.c.turn_id == turn_id if turn_id is not None else jobs.c.turn_id.is_(None),
        jobs.c.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)),
    )
    if (await conn.execute(duplicate.limit(1))).first() is not None:
        return False
    await conn.execute(
        sa.insert(jobs).values(
            kind=kind, session_id=session_id, turn_id=turn_id, status=JobStatus.QUEUED, payload=payload, created_at=time.time()
        )
    )
    return True


def _move(to: JobStatus, *sources: JobStatus) -> sa.Update:
    """An UPDATE of the status to `to` for a row in one of `sources`; the caller adds the row and
    its lease conditions. Raises `IllegalTransitionError` for a move the table does not have."""
    for source in sources:
        JOB_TRANSITIONS.check(source, to)
    return sa.update(jobs).where(jobs.c.status.in_(sources)).values(status=to)


def _claimable(db: Database) -> sa.ColumnElement[bool]:
    now = db.now()
    busy = jobs.alias("busy")
    # One running job per session: turns of a session never run concurrently.
    session_busy = (
        sa.select(busy.c.id)
        .where(
            busy.c.session_id == jobs.c.session_id,
            busy.c.id != jobs.c.id,
            busy.c.status == JobStatus.RUNNING,
            busy.c.lease_expires_at >= now,
        )
        .exists()
    )
    expired = sa.and_(jobs.c.status == JobStatus.RUNNING, jobs.c.lease_expires_at < now)
    due = sa.and_(jobs.c.status == JobStatus.QUEUED, sa.or_(jobs.c.run_after.is_(None), jobs.c.run_after <= now))
    return sa.and_(sa.or_(due, expired), ~session_busy)


async def has_claimable_job(db: Database) -> bool:
    """Whether a claim would find a job now; a read, which takes no write lock."""
    async with db.read() as conn:
        found = await conn.execute(sa.select(jobs.c.id).where(_claimable(db)).limit(1))
        return found.first() is not None


async def claim_job(db: Database, *, owner: str, lease_s: float) -> Job | None:
    """Claim the oldest claimable job, or return None."""
    async with db.write() as conn:
        candidate = sa.select(jobs.c.id, jobs.c.session_id).where(_claimable(db)).order_by(jobs.c.id).limit(1)
        if not db.is_sqlite:
            candidate = candidate.with_for_update(skip_locked=True, of=jobs)
        found = (await conn.execute(candidate)).first()
        if found is None:
            return None
        job_id = found.id
        if not db.is_sqlite:
            # Two claimants may each pick another job of one session (a job delivered twice):
            # neither sees the other's uncommitted claim. The session's lock orders them, and
            # the UPDATE below, a new statement, then sees the first one's claim and refuses.
            # (SQLite's BEGIN IMMEDIATE already orders every claim.)
            await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_CLAIM_LOCK_SPACE, sa.func.hashtext(found.session_id))))
        stmt = (
            # A queued job, or a running one whose worker let the lease expire (at-least-once).
            _move(JobStatus.RUNNING, JobStatus.QUEUED, JobStatus.RUNNING)
            .where(jobs.c.id == job_id, _claimable(db))
            .values(
                attempts=jobs.c.attempts + 1,
                lease_token=sa.case(
                    (jobs.c.lease_token == 0, sa.bindparam("first_token", (job_id << _TOKEN_SHIFT) + 1)),
                    else_=jobs.c.lease_token + 1,
                ),
                lease_owner=owner,
                lease_expires_at=db.now() + lease_s,
            )
            .returning(
                jobs.c.id, jobs.c.kind, jobs.c.session_id, jobs.c.turn_id, jobs.c.attempts, jobs.c.lease_token, jobs.c.payload
            )
        )
        row = (await conn.execute(stmt)).first()
        return Job(**row._asdict()) if row is not None else None


def _fenced(job: Job, to: JobStatus | None = None) -> sa.Update:
    """An UPDATE of the running `job` that only the current lease holder's token can make
    (fencing); with `to`, it also moves the job out of `running`."""
    stmt = _move(to, JobStatus.RUNNING) if to is not None else sa.update(jobs).where(jobs.c.status == JobStatus.RUNNING)
    return stmt.where(jobs.c.id == job.id, jobs.c.lease_token == job.lease_token)


async def renew_lease(db: Database, job: Job, *, lease_s: float) -> bool:
    """Extend the lease; False means it was lost and the worker must stop the job."""
    async with db.write() as conn:
        return (await conn.execute(_fenced(job).values(lease_expires_at=db.now() + lease_s))).rowcount == 1


async def complete_job(conn: Connection, job: Job, *, error: str | None = None) -> bool:
    """Mark the job done (or failed) in the caller's transaction; False if the lease was lost."""
    stmt = _fenced(job, JobStatus.FAILED if error else JobStatus.DONE).values(last_error=error, lease_expires_at=None)
    return (await conn.execute(stmt)).rowcount == 1


async def release_job(db: Database, job: Job, *, delay_s: float = 0.0) -> None:
    """Hand an unfinished job back (graceful shutdown) instead of waiting for expiry, claimable
    again at once or after `delay_s` (a call deferred to a retry); the claim it was given back
    from does not count as an attempt."""
    async with db.write() as conn:
        run_after = db.now() + delay_s if delay_s > 0 else None
        await conn.execute(
            _fenced(job, JobStatus.QUEUED).values(
                attempts=jobs.c.attempts - 1, lease_owner=None, lease_expires_at=None, run_after=run_after
            )
        )


async def retry_job(db: Database, job: Job, *, delay_s: float, error: str) -> bool:
    """Queue a job that raised again, claimable after `delay_s`; False if the lease was lost."""
    async with db.write() as conn:
        stmt = _fenced(job, JobStatus.QUEUED).values(
            run_after=db.now() + delay_s, last_error=error, lease_owner=None, lease_expires_at=None
        )
        return (await conn.execute(stmt)).rowcount == 1


async def park_job(conn: Connection, job: Job, *, error: str) -> bool:
    """Stop retrying a job that keeps failing, in the caller's transaction; False if the lease was lost."""
    stmt = _fenced(job, JobStatus.PARKED).values(last_error=error, lease_expires_at=None)
    return (await conn.execute(stmt)).rowcount == 1
