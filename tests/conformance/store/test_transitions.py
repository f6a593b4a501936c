"""Guarded status writes, on SQLite and PostgreSQL: each entity's table walked move by move
(allowed moves happen, every other one raises and changes nothing), stale writers lose, and
of two writers moving one turn at once exactly one wins."""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import anyio
import pytest
import sqlalchemy as sa

from cairn.errors import IllegalTransitionError, StatusConflictError
from cairn.ids import new_session_id, new_turn_id
from cairn.states import (
    ITEM_TRANSITIONS,
    JOB_TRANSITIONS,
    SESSION_TRANSITIONS,
    TURN_TRANSITIONS,
    ItemStatus,
    JobStatus,
    SessionStatus,
    Transitions,
    TurnStatus,
)
from cairn.store.db import Connection, Database
from cairn.store.items import ItemRecord, get_item, insert_item, new_item, transition_item
from cairn.store.jobs import Job, _move, claim_job, complete_job, enqueue_job, park_job, release_job, retry_job
from cairn.store.sessions import SessionRecord, get_session, insert_session, transition_session, update_session
from cairn.store.tables import items, jobs, sessions, turns
from cairn.store.turns import TurnRecord, get_turn, insert_turn, transition_turn, update_turn
from tests.lock_waits import LockWaits

pytestmark = pytest.mark.anyio

S = TypeVar("S", SessionStatus, TurnStatus, ItemStatus, JobStatus)


class _NoSQL:
    """A connection that fails any use: an illegal move must be refused before any SQL."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"SQL was attempted ({name}) for an illegal move")


_NO_SQL = cast(Connection, _NoSQL())


async def _new_session(db: Database) -> SessionRecord:
    now = time.time()
    record = SessionRecord(
        id=new_session_id(), tenant="t1", status=SessionStatus.IDLE, agent={"model": "scripted:x"},
        environment={"type": "none"}, environment_id="env_1", metadata={}, error=None, usage=None, last_event_seq=0,
        next_turn_ordinal=0, outputs_manifest={}, created_at=now, last_active_at=now,
    )
    async with db.write() as conn:
        await insert_session(conn, record)
    return record


async def _new_turn(db: Database, session_id: str, ordinal: int = 0) -> TurnRecord:
    record = TurnRecord(
        id=new_turn_id(), session_id=session_id, ordinal=ordinal, status=TurnStatus.QUEUED, input=[], step=0,
        next_output_index=0, cancel_requested=False, lease_token=None, error=None, usage=None, created_at=time.time(),
        started_at=None, completed_at=None,
    )
    async with db.write() as conn:
        await insert_turn(conn, record)
    return record


async def _force(db: Database, table: sa.Table, key: sa.ColumnElement[bool], status: str) -> None:
    """Test setup only: put a row in `status` past the guard."""
    async with db.write() as conn:
        await conn.execute(sa.update(table).where(key).values(status=status))


async def _status(db: Database, table: sa.Table, key: sa.ColumnElement[bool]) -> str:
    async with db.read() as conn:
        return str((await conn.execute(sa.select(table.c.status).where(key))).scalar_one())


async def _walk(
    db: Database,
    transitions: Transitions[S],
    statuses: type[S],
    table: sa.Table,
    create: Callable[[], Awaitable[Any]],
    get: Callable[[Connection, str], Awaitable[Any]],
    move: Callable[[Connection, Any, S], Awaitable[Any]],
) -> None:
    """For every (from, to): a fresh row in `from`; the move succeeds and is stored if the table
    allows it, else it raises before any SQL and the row (read back whole) is unchanged."""

    async def read(row_id: str) -> Any:
        async with db.read() as conn:
            found = await get(conn, row_id)
        assert found is not None
        return found

    for from_, to in itertools.product(statuses, repeat=2):
        created = await create()
        await _force(db, table, table.c.id == created.id, from_)
        row = await read(created.id)
        if transitions.is_allowed(from_, to):
            async with db.write() as conn:
                moved = await move(conn, row, to)
            assert moved.status == to and await read(row.id) == moved, (from_, to)
            continue
        with pytest.raises(IllegalTransitionError):
            await move(_NO_SQL, row, to)
        with pytest.raises(IllegalTransitionError):
            async with db.write() as conn:
                await move(conn, row, to)
        assert await read(row.id) == row, (from_, to)


async def test_session_moves_follow_the_table(db: Database) -> None:
    async def move(conn: Connection, session: SessionRecord, to: SessionStatus) -> SessionRecord:
        return await transition_session(conn, session, to, last_active_at=session.last_active_at + 1)

    await _walk(db, SESSION_TRANSITIONS, SessionStatus, sessions, lambda: _new_session(db), get_session, move)


async def test_turn_moves_follow_the_table(db: Database) -> None:
    session = await _new_session(db)
    ordinals = itertools.count()

    async def move(conn: Connection, turn: TurnRecord, to: TurnStatus) -> TurnRecord:
        return await transition_turn(conn, turn, to, lease_token=7)

    await _walk(db, TURN_TRANSITIONS, TurnStatus, turns, lambda: _new_turn(db, session.id, next(ordinals)), get_turn, move)


async def test_item_moves_follow_the_table(db: Database) -> None:
    session = await _new_session(db)
    turn = await _new_turn(db, session.id)

    async def create() -> ItemRecord:
        async with db.write() as conn:
            return await insert_item(conn, new_item(session_id=session.id, turn_id=turn.id, type="message", data={"n": 0}))

    async def move(conn: Connection, item: ItemRecord, to: ItemStatus) -> ItemRecord:
        return await transition_item(conn, item, to, data={"n": 1})

    await _walk(db, ITEM_TRANSITIONS, ItemStatus, items, create, get_item, move)


async def test_job_moves_follow_the_table(db: Database) -> None:
    """Every job write is built by `_move`: it refuses what the table lacks; and each queue
    function moves a job only out of the states the table allows it to leave."""
    for from_, to in itertools.product(JobStatus, repeat=2):
        if JOB_TRANSITIONS.is_allowed(from_, to):
            _move(to, from_)
        else:
            with pytest.raises(IllegalTransitionError):
                _move(to, from_)

    async def held_job(status: JobStatus, *, lease_s: float = 300) -> Job:
        """A claimed job, then put in `status` (its lease token stays valid)."""
        session_id = new_session_id()
        async with db.write() as conn:
            await enqueue_job(conn, kind="run_turn", session_id=session_id, turn_id=None)
        job = await claim_job(db, owner="w", lease_s=lease_s)
        assert job is not None and job.session_id == session_id
        await _force(db, jobs, jobs.c.id == job.id, status)
        return job

    async def complete(job: Job, *, error: str | None = None) -> bool:
        async with db.write() as conn:
            return await complete_job(conn, job, error=error)

    async def park(job: Job) -> bool:
        async with db.write() as conn:
            return await park_job(conn, job, error="boom")

    for from_ in JobStatus:
        for to, run in (
            (JobStatus.DONE, complete),
            (JobStatus.FAILED, lambda job: complete(job, error="boom")),
            (JobStatus.QUEUED, lambda job: release_job(db, job)),
            (JobStatus.QUEUED, lambda job: retry_job(db, job, delay_s=0, error="boom")),
            (JobStatus.PARKED, park),
        ):
            job = await held_job(from_)
            await run(job)
            expected = to if JOB_TRANSITIONS.is_allowed(from_, to) else from_
            assert await _status(db, jobs, jobs.c.id == job.id) == expected, (from_, to)
            await _force(db, jobs, jobs.c.id == job.id, JobStatus.DONE)  # out of the next claim's way
        # Claiming: a queued job, or a running one whose lease expired; never a finished one.
        job = await held_job(from_, lease_s=-1)
        again = await claim_job(db, owner="w2", lease_s=300)
        allowed = JOB_TRANSITIONS.is_allowed(from_, JobStatus.RUNNING)
        assert (again is not None and again.id == job.id) is allowed, from_
        assert await _status(db, jobs, jobs.c.id == job.id) == (JobStatus.RUNNING if allowed else from_)
        await _force(db, jobs, jobs.c.id == job.id, JobStatus.DONE)


async def test_a_writer_holding_a_stale_record_loses(db: Database) -> None:
    session = await _new_session(db)
    turn = await _new_turn(db, session.id)
    async with db.write() as conn:
        started = await transition_turn(conn, turn, TurnStatus.IN_PROGRESS, lease_token=1)
        await transition_session(conn, session, SessionStatus.IN_PROGRESS, last_active_at=2.0)
    with pytest.raises(StatusConflictError):
        async with db.write() as conn:
            await transition_turn(conn, turn, TurnStatus.CANCELLED)  # still thinks it is queued
    with pytest.raises(StatusConflictError):
        async with db.write() as conn:
            await transition_session(conn, session, SessionStatus.IN_PROGRESS, last_active_at=3.0)
    async with db.read() as conn:
        assert await get_turn(conn, turn.id) == started
        current = await get_session(conn, session.id)
    assert current is not None and current.status == SessionStatus.IN_PROGRESS and current.last_active_at == 2.0


async def test_generic_updates_refuse_to_write_a_status(db: Database) -> None:
    session = await _new_session(db)
    turn = await _new_turn(db, session.id)
    async with db.write() as conn:
        with pytest.raises(RuntimeError, match="transition_turn"):
            await update_turn(conn, turn.id, status=TurnStatus.IN_PROGRESS)
        with pytest.raises(RuntimeError, match="transition_session"):
            await update_session(conn, session.id, status=SessionStatus.IN_PROGRESS)
        with pytest.raises(RuntimeError, match="set_environment_status"):
            await update_session(conn, session.id, environment_status="suspended")
        with pytest.raises(IllegalTransitionError):
            await insert_item(
                conn, new_item(session_id=session.id, turn_id=turn.id, type="message", data={}, status=ItemStatus.INCOMPLETE)
            )


@pytest.mark.parametrize("first", [TurnStatus.COMPLETED, TurnStatus.CANCELLED])
async def test_two_writers_moving_one_turn_at_once_exactly_one_wins(db: Database, first: TurnStatus) -> None:
    """Both writers read the turn in progress; one completes it, the other cancels it. The first
    to write holds its transaction open until the second waits for it (PostgreSQL: on the row;
    SQLite: for the write lock), then commits; the second must lose."""
    second = TurnStatus.CANCELLED if first == TurnStatus.COMPLETED else TurnStatus.COMPLETED
    session = await _new_session(db)
    queued = await _new_turn(db, session.id)
    async with db.write() as conn:
        turn = await transition_turn(conn, queued, TurnStatus.IN_PROGRESS, lease_token=1)
    first_wrote = anyio.Event()
    outcomes: dict[TurnStatus, str] = {}

    async def writer(to: TurnStatus, waits: LockWaits) -> None:
        try:
            if to == second:
                await first_wrote.wait()
            async with db.write() as conn:
                await transition_turn(conn, turn, to, completed_at=time.time(), lease_token=None)
                if to == first:
                    first_wrote.set()
                    await waits.until_another_waits(db, f"the writer moving the turn to {second} to wait for the lock")
            outcomes[to] = "won"
        except StatusConflictError:
            outcomes[to] = "lost"

    with LockWaits() as waits:
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer, second, waits)
            tg.start_soon(writer, first, waits)
    assert outcomes == {first: "won", second: "lost"}
    assert await _status(db, turns, turns.c.id == turn.id) == first

