"""The idempotency ledger's store, on SQLite and PostgreSQL: who may run an operation, what a
dead holder leaves behind, and that a worker whose job was taken over changes nothing.

Holders are real job claims (`claim_job`); a holder dies by its job's lease running out, and
is taken over by the job being claimed again, exactly as in a worker crash.
"""

from __future__ import annotations

import dataclasses
import time

import anyio
import pytest
import sqlalchemy as sa

from cairn.errors import IllegalTransitionError, StatusConflictError
from cairn.states import LedgerStatus
from cairn.store.db import Database
from cairn.store.jobs import Job, claim_job, enqueue_job
from cairn.store.ledger import (
    Claim,
    ClaimKind,
    LedgerEntry,
    Operation,
    claim_operation,
    close_turn_entries,
    get_entry,
    list_entries,
    referenced_result_blobs,
    reopen_entry,
    resolve_entry,
    settle_entry,
    start_execution,
    sweep_settled_entries,
)
from cairn.store.tables import jobs, ledger_entries

pytestmark = pytest.mark.anyio

OPERATION = Operation(
    operation_key="op_deploy_r42", tenant="t1", session_id="sess_1", turn_id="turn_1", call_id="call_1",
    approval_id="appr_1", tool_name="deploy_release", arguments_digest="d" * 64,
)


async def _job(db: Database, session_id: str) -> Job:
    async with db.write() as conn:
        await enqueue_job(conn, kind="run_turn", session_id=session_id, turn_id=None)
    job = await claim_job(db, owner="test", lease_s=300)
    assert job is not None
    return job


async def _claim(db: Database, job: Job, operation: Operation = OPERATION, *, max_attempts: int = 3) -> Claim:
    async with db.write() as conn:
        return await claim_operation(conn, operation, token=job.lease_token, now=db.now(), max_attempts=max_attempts)


async def _die(db: Database, job: Job) -> Job:
    """The job's worker dies: its lease runs out and another claim of the job takes over."""
    async with db.write() as conn:
        await conn.execute(sa.update(jobs).where(jobs.c.id == job.id).values(lease_expires_at=0))
    taken = await claim_job(db, owner="other", lease_s=300)
    assert taken is not None and taken.id == job.id and taken.lease_token != job.lease_token
    return taken


async def _start(db: Database, entry: LedgerEntry, job: Job) -> LedgerEntry:
    async with db.write() as conn:
        return await start_execution(conn, entry, token=job.lease_token)


async def _settle(db: Database, entry: LedgerEntry, job: Job, to: LedgerStatus, **values: object) -> LedgerEntry:
    async with db.write() as conn:
        return await settle_entry(conn, entry, to, token=job.lease_token, **values)  # type: ignore[arg-type]


async def _stored(db: Database) -> LedgerEntry:
    async with db.read() as conn:
        entry = await get_entry(conn, OPERATION.operation_key)
    assert entry is not None
    return entry


async def test_the_first_claim_runs_a_live_holder_makes_others_wait_and_success_is_reused(db: Database) -> None:
    first, second = await _job(db, "sess_1"), await _job(db, "sess_2")
    claim = await _claim(db, first)
    assert claim.kind is ClaimKind.RUN and claim.entry.status is LedgerStatus.RESERVED
    assert (await _claim(db, second)).kind is ClaimKind.WAIT
    assert (await _claim(db, first)).kind is ClaimKind.RUN  # the holder itself, again
    running = await _start(db, claim.entry, first)
    assert running.status is LedgerStatus.EXECUTING and running.attempts == 1
    assert (await _claim(db, second)).kind is ClaimKind.WAIT
    done = await _settle(db, running, first, LedgerStatus.SUCCEEDED, result={"output": "deployed:r42"})
    reused = await _claim(db, second)
    assert reused.kind is ClaimKind.REUSE and reused.entry.result == {"output": "deployed:r42"}
    assert (await _stored(db)).reuses == 1 and done.attempts == 1


async def test_the_same_key_with_other_arguments_is_refused_and_changes_nothing(db: Database) -> None:
    job = await _job(db, "sess_1")
    await _claim(db, job)
    before = await _stored(db)
    other = dataclasses.replace(OPERATION, arguments_digest="e" * 64)
    assert (await _claim(db, job, other)).kind is ClaimKind.CONFLICT
    assert (await _claim(db, job, dataclasses.replace(OPERATION, tenant="t2"))).kind is ClaimKind.CONFLICT
    assert await _stored(db) == before


async def test_a_reservation_whose_holder_died_is_taken_over(db: Database) -> None:
    job = await _job(db, "sess_1")
    await _claim(db, job)
    taken = await _die(db, job)
    claim = await _claim(db, taken)
    assert claim.kind is ClaimKind.RUN and claim.entry.holder_token == taken.lease_token
    assert claim.entry.status is LedgerStatus.RESERVED and claim.entry.attempts == 0


async def test_an_execution_whose_holder_died_is_probed_never_run_again(db: Database) -> None:
    job = await _job(db, "sess_1")
    entry = await _start(db, (await _claim(db, job)).entry, job)
    taken = await _die(db, job)
    probe = await _claim(db, taken)
    assert probe.kind is ClaimKind.PROBE and probe.entry.status is LedgerStatus.EXECUTING
    assert probe.entry.holder_token == taken.lease_token
    # The probe cannot tell: uncertain, and every later claim is told so, never to run.
    uncertain = await _settle(db, probe.entry, taken, LedgerStatus.UNCERTAIN, reason="the worker died while it ran; no probe")
    again = await _die(db, taken)
    assert (await _claim(db, again)).kind is ClaimKind.UNCERTAIN
    async with db.write() as conn:
        resolved = await resolve_entry(conn, uncertain, by="key_ops", result={"output": "deployed:r42"})
    assert resolved.status is LedgerStatus.SUCCEEDED and resolved.resolved_by == "key_ops" and entry.attempts == 1
    assert (await _claim(db, again)).kind is ClaimKind.REUSE


async def test_a_worker_whose_job_was_taken_over_changes_nothing(db: Database) -> None:
    job = await _job(db, "sess_1")
    entry = await _start(db, (await _claim(db, job)).entry, job)
    await _die(db, job)
    before = await _stored(db)
    for to in (LedgerStatus.SUCCEEDED, LedgerStatus.FAILED_TERMINAL, LedgerStatus.UNCERTAIN):
        with pytest.raises(StatusConflictError):
            await _settle(db, entry, job, to, result={"output": "late"})
    assert await _stored(db) == before


async def test_a_retryable_failure_waits_for_its_time_then_runs_and_gives_up_at_the_limit(db: Database) -> None:
    job = await _job(db, "sess_1")
    other = await _job(db, "sess_2")
    entry = await _start(db, (await _claim(db, job, max_attempts=2)).entry, job)
    await _settle(db, entry, job, LedgerStatus.FAILED_RETRYABLE, error="503 from the deploy API", retry_after=db.now() + 3600)
    assert (await _claim(db, other, max_attempts=2)).kind is ClaimKind.WAIT
    async with db.write() as conn:
        await conn.execute(sa.update(ledger_entries).values(retry_after=0))
    retried = await _claim(db, other, max_attempts=2)
    assert retried.kind is ClaimKind.RUN and retried.entry.holder_token == other.lease_token
    second = await _start(db, retried.entry, other)
    await _settle(db, second, other, LedgerStatus.FAILED_RETRYABLE, error="503 again", retry_after=db.now())
    final = await _claim(db, job, max_attempts=2)
    assert final.kind is ClaimKind.FAILED and final.entry.status is LedgerStatus.FAILED_TERMINAL
    assert final.entry.error is not None and "gave up after 2 attempts" in final.entry.error


async def test_moves_outside_the_table_are_refused_before_any_sql(db: Database) -> None:
    job = await _job(db, "sess_1")
    entry = (await _claim(db, job)).entry
    with pytest.raises(IllegalTransitionError):
        await _settle(db, entry, job, LedgerStatus.SUCCEEDED)  # reserved → succeeded: never started
    async with db.write() as conn:
        with pytest.raises(IllegalTransitionError):
            await resolve_entry(conn, entry, by="key_ops", result={})  # only an uncertain entry is resolved
    assert (await _stored(db)).status is LedgerStatus.RESERVED


async def test_two_claims_at_once_give_one_holder(db: Database) -> None:
    first, second = await _job(db, "sess_1"), await _job(db, "sess_2")
    kinds: list[ClaimKind] = []

    async def claim(job: Job) -> None:
        kinds.append((await _claim(db, job)).kind)

    async with anyio.create_task_group() as tg:
        tg.start_soon(claim, first)
        tg.start_soon(claim, second)
    assert sorted(kinds) == sorted([ClaimKind.RUN, ClaimKind.WAIT])


async def test_entries_are_listed_per_tenant_and_status(db: Database) -> None:
    job = await _job(db, "sess_1")
    for index in range(3):
        await _claim(db, job, dataclasses.replace(OPERATION, operation_key=f"op_{index}", call_id=f"call_{index}"))
    await _claim(db, job, dataclasses.replace(OPERATION, operation_key="op_other", tenant="t2"))
    async with db.read() as conn:
        first = await list_entries(conn, "t1", status=LedgerStatus.RESERVED, after=None, order="asc", limit=2)
        rest = await list_entries(conn, "t1", status=None, after=first.data[-1].operation_key, order="asc", limit=2)
        none = await list_entries(conn, "t1", status=LedgerStatus.UNCERTAIN, after=None, order="asc", limit=2)
    assert [e.operation_key for e in first.data] == ["op_0", "op_1"] and first.has_more
    assert [e.operation_key for e in rest.data] == ["op_2"] and not rest.has_more
    assert none.data == []


async def test_a_probe_that_found_nothing_reopens_the_entry_for_its_holder_only(db: Database) -> None:
    job = await _job(db, "sess_1")
    entry = await _start(db, (await _claim(db, job)).entry, job)
    taken = await _die(db, job)
    probe = (await _claim(db, taken)).entry
    async with db.write() as conn:
        with pytest.raises(StatusConflictError):
            await reopen_entry(conn, probe, token=job.lease_token)  # the dead holder cannot
        reopened = await reopen_entry(conn, probe, token=taken.lease_token)
    assert (reopened.status, reopened.attempts) == (LedgerStatus.RESERVED, entry.attempts)
    again = await _start(db, reopened, taken)
    assert (again.status, again.attempts) == (LedgerStatus.EXECUTING, 2)


async def test_a_retry_not_due_says_how_long_to_wait(db: Database) -> None:
    job, other = await _job(db, "sess_1"), await _job(db, "sess_2")
    entry = await _start(db, (await _claim(db, job)).entry, job)
    await _settle(db, entry, job, LedgerStatus.FAILED_RETRYABLE, error="busy", retry_after=db.now() + 60)
    wait = await _claim(db, other)
    assert wait.kind is ClaimKind.WAIT and wait.wait_s is not None and 50 < wait.wait_s <= 60


async def test_a_turn_that_ends_settles_what_its_calls_left(db: Database) -> None:
    job = await _job(db, "sess_1")
    keys = {"reserved": "op_r", "executing": "op_e", "retry": "op_f", "done": "op_d"}
    claimed = {name: (await _claim(db, job, dataclasses.replace(OPERATION, operation_key=key))).entry for name, key in keys.items()}
    for name in ("executing", "retry", "done"):
        claimed[name] = await _start(db, claimed[name], job)
    await _settle(db, claimed["retry"], job, LedgerStatus.FAILED_RETRYABLE, error="busy", retry_after=db.now())
    await _settle(db, claimed["done"], job, LedgerStatus.SUCCEEDED, result={"output": "ok"})
    async with db.write() as conn:
        assert await close_turn_entries(conn, OPERATION.turn_id) == 1
        after = {name: await get_entry(conn, key) for name, key in keys.items()}
    shown = {name: (e.status, e.error or e.reason) for name, e in after.items() if e is not None}
    assert shown == {
        "reserved": (LedgerStatus.FAILED_TERMINAL, "its turn ended before the tool started; it did not run"),
        "executing": (LedgerStatus.UNCERTAIN, "its turn ended while the tool ran; whether it took effect is unknown"),
        "retry": (LedgerStatus.FAILED_TERMINAL, "busy (not retried: its turn ended)"),
        "done": (LedgerStatus.SUCCEEDED, None),
    }


async def test_settled_entries_of_turns_that_are_over_are_swept_and_their_blobs_released(db: Database) -> None:
    job = await _job(db, "sess_1")
    entry = await _start(db, (await _claim(db, job)).entry, job)
    await _settle(db, entry, job, LedgerStatus.SUCCEEDED, result={"blob": "b" * 64, "size": 9}, result_blob="b" * 64)
    async with db.write() as conn:
        assert await referenced_result_blobs(conn, ["b" * 64, "c" * 64]) == {"b" * 64}
        # No turn row: the turn is gone (its session deleted). Too young first, then past its retention.
        assert await sweep_settled_entries(conn, settled_before=0, limit=10) == []
        assert len(await sweep_settled_entries(conn, settled_before=time.time() + 1, limit=10)) == 1
        assert await referenced_result_blobs(conn, ["b" * 64]) == set()
