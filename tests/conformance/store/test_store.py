"""The storage contract, run against SQLite and PostgreSQL alike."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import anyio
import pytest
import sqlalchemy as sa

from cairn.errors import CairnMisuseError, InvalidRequestError, LeaseLostError
from cairn.ids import new_session_id, new_turn_id
from cairn.store.db import Database
from cairn.store.events import append_events, read_events_after
from cairn.store.idempotency import record_idempotency_key
from cairn.store.jobs import claim_job, complete_job, enqueue_job, release_job, renew_lease
from cairn.store.keys import create_key, find_key, revoke_key
from cairn.store.sessions import SessionRecord, get_session, insert_session, list_sessions, update_session
from cairn.store.tables import jobs
from cairn.store.turns import TurnRecord, advance_step, fence_turn, get_turn, insert_turn, update_turn
from tests.waits import until

pytestmark = pytest.mark.anyio


def _session(
    tenant: str = "t1", metadata: dict[str, str] | None = None, created_at: float | None = None, agent_id: str = "agent_x"
) -> SessionRecord:
    now = created_at or time.time()
    return SessionRecord(
        id=new_session_id(), tenant=tenant, status="idle", agent={"id": agent_id, "model": "scripted:x"}, environment={"type": "none"},
        environment_id="env_1", metadata=metadata or {}, error=None, usage=None, last_event_seq=0,
        next_turn_ordinal=0, outputs_manifest={}, created_at=now, last_active_at=now,
    )


def _turn(session_id: str, ordinal: int = 0) -> TurnRecord:
    return TurnRecord(
        id=new_turn_id(), session_id=session_id, ordinal=ordinal, status="queued", input=[], step=0, next_output_index=0,
        cancel_requested=False, lease_token=None, error=None, usage=None, created_at=time.time(), started_at=None,
        completed_at=None,
    )


async def _new_session(db: Database, **kwargs: Any) -> SessionRecord:
    record = _session(**kwargs)
    async with db.write() as conn:
        await insert_session(conn, record)
    return record


async def test_invariant_1_event_sequences_are_gap_free_under_concurrent_appends(db: Database) -> None:
    session = await _new_session(db)

    async def writer(n: int) -> None:
        for i in range(10):
            async with db.write() as conn:
                await append_events(conn, session.id, [{"type": "x", "writer": n, "i": i}, {"type": "y"}])

    async with anyio.create_task_group() as tg:
        for n in range(5):
            tg.start_soon(writer, n)
    async with db.read() as conn:
        records = await read_events_after(conn, session.id, 0, limit=1000)
    assert [r.seq for r in records] == list(range(1, 101))
    assert len({r.data for r in records}) == 100


async def test_invariant_1_a_rolled_back_append_leaves_no_hole_and_is_never_readable(db: Database) -> None:
    session = await _new_session(db)
    async with db.write() as conn:
        await append_events(conn, session.id, [{"type": "first"}])
    with pytest.raises(RuntimeError):
        async with db.write() as conn:
            await append_events(conn, session.id, [{"type": "doomed"}])
            raise RuntimeError("abort")
    async with db.write() as conn:
        await append_events(conn, session.id, [{"type": "second"}])
    async with db.read() as conn:
        records = await read_events_after(conn, session.id, 0, limit=10)
    assert [(r.seq, r.type) for r in records] == [(1, "first"), (2, "second")]


async def test_events_carry_sequence_numbers_and_stable_unique_ids(db: Database) -> None:
    a, b = await _new_session(db), await _new_session(db)
    async with db.write() as conn:
        first = await append_events(conn, a.id, [{"type": "t"}])
        second = await append_events(conn, b.id, [{"type": "t"}])
    assert '"sequence_number":1' in first[0].data
    assert first[0].data != second[0].data
    async with db.read() as conn:
        assert (await read_events_after(conn, a.id, 0, limit=5))[0].data == first[0].data


async def test_sessions_are_scoped_by_tenant(db: Database) -> None:
    mine = await _new_session(db, tenant="t1")
    async with db.read() as conn:
        assert await get_session(conn, mine.id, tenant="t1") is not None
        assert await get_session(conn, mine.id, tenant="t2") is None


async def test_session_list_paginates_in_both_orders_and_filters_metadata(db: Database) -> None:
    base = time.time()
    created = [await _new_session(db, metadata={"team": "a" if i % 2 else "b"}, created_at=base + i) for i in range(5)]
    await _new_session(db, tenant="other", created_at=base + 10)
    async with db.read() as conn:
        first = await list_sessions(conn, "t1", after=None, order="asc", limit=2, metadata={})
        rest = await list_sessions(conn, "t1", after=first.data[-1].id, order="asc", limit=10, metadata={})
        desc = await list_sessions(conn, "t1", after=None, order="desc", limit=10, metadata={})
        team_a = await list_sessions(conn, "t1", after=None, order="asc", limit=10, metadata={"team": "a"})
        with pytest.raises(InvalidRequestError):
            await list_sessions(conn, "t1", after="sess_unknown", order="asc", limit=10, metadata={})
    assert first.has_more and not rest.has_more
    assert [s.id for s in first.data + rest.data] == [s.id for s in created]
    assert [s.id for s in desc.data] == [s.id for s in reversed(created)]
    assert [s.id for s in team_a.data] == [created[1].id, created[3].id]


@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_session_list_filters_by_agent_before_it_paginates(db: Database, order: str) -> None:
    """Pages of a filtered list are full but the last, and `has_more` says whether one follows."""
    base = time.time()
    created = [await _new_session(db, agent_id="agent_a" if i % 2 else "agent_b", created_at=base + i) for i in range(6)]
    await _new_session(db, tenant="other", agent_id="agent_a", created_at=base + 10)
    pages = []
    after = None
    async with db.read() as conn:
        while True:
            page = await list_sessions(conn, "t1", after=after, order=order, limit=2, metadata={}, agent_id="agent_a")
            pages.append(page)
            if not page.has_more:
                break
            after = page.data[-1].id
    agent_a = [s.id for s in created if s.agent["id"] == "agent_a"]
    expected = agent_a if order == "asc" else agent_a[::-1]
    assert [[s.id for s in p.data] for p in pages] == [expected[:2], expected[2:]]
    assert [p.has_more for p in pages] == [True, False]


async def test_a_pinned_agent_version_is_stored_at_create_and_never_updated(db: Database) -> None:
    pinned = dataclasses.replace(_session(agent_id="release-agent"), agent_version="release-agent/v2", agent_revision="ab" * 32)
    plain = await _new_session(db)
    async with db.write() as conn:
        await insert_session(conn, pinned)
        stored = await get_session(conn, pinned.id)
        assert stored is not None and (stored.agent_version, stored.agent_revision) == ("release-agent/v2", "ab" * 32)
        unpinned = await get_session(conn, plain.id)
        assert unpinned is not None and (unpinned.agent_version, unpinned.agent_revision) == (None, None)
        with pytest.raises(CairnMisuseError, match="sessions.agent_version is written only by insert_session"):
            await update_session(conn, pinned.id, agent_version="release-agent/v3")


async def test_idempotency_keys_repeat_only_for_the_same_request(db: Database) -> None:
    session = await _new_session(db)
    async with db.write() as conn:
        assert await record_idempotency_key(conn, session.id, "k1", "digest-a") is False
    async with db.write() as conn:
        assert await record_idempotency_key(conn, session.id, "k1", "digest-a") is True
        with pytest.raises(InvalidRequestError):
            await record_idempotency_key(conn, session.id, "k1", "digest-b")


async def test_keys_are_found_by_secret_until_revoked(db: Database) -> None:
    async with db.write() as conn:
        record, secret = await create_key(conn, tenant="acme", role="member")
        with pytest.raises(InvalidRequestError):
            await create_key(conn, tenant="acme", role="superuser")
    async with db.write() as conn:
        found = await find_key(conn, secret)
        assert found is not None and found.tenant == "acme"
        assert await find_key(conn, secret + "x") is None
        assert await revoke_key(conn, record.id)
        assert await find_key(conn, secret) is None


async def test_a_claimed_job_is_not_claimed_twice_while_its_lease_lives(db: Database) -> None:
    async with db.write() as conn:
        await enqueue_job(conn, kind="run_turn", session_id="s1", turn_id="t1")
        assert not await enqueue_job(conn, kind="run_turn", session_id="s1", turn_id="t1"), "duplicate work is not queued"
    job = await claim_job(db, owner="w1", lease_s=30)
    assert job is not None and job.turn_id == "t1"
    assert await claim_job(db, owner="w2", lease_s=30) is None


async def test_concurrent_claims_hand_each_job_to_exactly_one_worker(db: Database) -> None:
    async with db.write() as conn:
        for i in range(20):
            await enqueue_job(conn, kind="run_turn", session_id=f"s{i}", turn_id=f"t{i}")
    claimed: list[str | None] = []

    async def worker(name: str) -> None:
        while (job := await claim_job(db, owner=name, lease_s=30)) is not None:
            claimed.append(job.turn_id)

    async with anyio.create_task_group() as tg:
        for n in range(4):
            tg.start_soon(worker, f"w{n}")
    assert sorted(claimed, key=str) == sorted((f"t{i}" for i in range(20)), key=str)


async def test_an_expired_lease_is_reclaimed_and_the_old_holder_is_fenced_off(db: Database) -> None:
    async with db.write() as conn:
        await enqueue_job(conn, kind="run_turn", session_id="s1", turn_id="t1")
    old = await claim_job(db, owner="w1", lease_s=0.2)
    assert old is not None
    new = await until(lambda: claim_job(db, owner="w2", lease_s=30), "the lease to expire and the job to be claimed again")
    assert new.id == old.id and new.lease_token != old.lease_token
    assert not await renew_lease(db, old, lease_s=30)
    async with db.write() as conn:
        assert not await complete_job(conn, old)
        assert await complete_job(conn, new)
    assert await claim_job(db, owner="w3", lease_s=30) is None


async def test_one_session_runs_one_job_at_a_time(db: Database) -> None:
    async with db.write() as conn:
        await enqueue_job(conn, kind="run_turn", session_id="s1", turn_id="t1")
        await enqueue_job(conn, kind="run_turn", session_id="s1", turn_id="t2")
        await enqueue_job(conn, kind="run_turn", session_id="s2", turn_id="t3")
    first = await claim_job(db, owner="w", lease_s=30)
    second = await claim_job(db, owner="w", lease_s=30)
    assert first is not None and second is not None
    assert (first.turn_id, second.turn_id) == ("t1", "t3")
    assert await claim_job(db, owner="w", lease_s=30) is None
    async with db.write() as conn:
        await complete_job(conn, first)
    third = await claim_job(db, owner="w", lease_s=30)
    assert third is not None and third.turn_id == "t2"


async def test_a_released_job_is_claimable_at_once(db: Database) -> None:
    async with db.write() as conn:
        await enqueue_job(conn, kind="run_turn", session_id="s1", turn_id="t1")
    job = await claim_job(db, owner="w1", lease_s=300)
    assert job is not None
    await release_job(db, job)
    again = await claim_job(db, owner="w2", lease_s=300)
    assert again is not None and again.id == job.id and again.lease_token != job.lease_token
    async with db.read() as conn:
        status = (await conn.execute(sa.select(jobs.c.status).where(jobs.c.id == job.id))).scalar_one()
    assert status == "running"


async def test_turn_writes_are_fenced_by_the_current_lease_token(db: Database) -> None:
    session = await _new_session(db)
    turn = _turn(session.id)
    async with db.write() as conn:
        await insert_turn(conn, turn)
        await update_turn(conn, turn.id, lease_token=7)
    async with db.write() as conn:
        await fence_turn(conn, turn.id, 7)
        with pytest.raises(LeaseLostError):
            await fence_turn(conn, turn.id, 6)


async def test_a_step_advances_only_under_the_current_lease_token(db: Database) -> None:
    session = await _new_session(db)
    turn = _turn(session.id)
    async with db.write() as conn:
        await insert_turn(conn, turn)
        turn = await update_turn(conn, turn.id, lease_token=7)
    usage = {"input_tokens": 3, "output_tokens": 1}
    with pytest.raises(LeaseLostError):
        async with db.write() as conn:
            await advance_step(conn, turn, 6, step=1, usage=usage, next_output_index=2)
    async with db.write() as conn:
        advanced = await advance_step(conn, turn, 7, step=1, usage=usage, next_output_index=2)
    async with db.read() as conn:
        assert await get_turn(conn, turn.id) == advanced
    assert (advanced.step, advanced.usage, advanced.next_output_index, advanced.lease_token) == (1, usage, 2, 7)


async def test_two_jobs_of_one_session_claimed_at_once_one_runs(db: Database) -> None:
    """A job delivered twice (two rows of one turn), claimed by two workers at the same moment:
    one runs, the other waits for it (the session runs one job at a time)."""
    for round_ in range(10):
        async with db.write() as conn:
            for copy in range(2):
                await conn.execute(sa.insert(jobs).values(kind="run_turn", session_id=f"s{round_}", turn_id=f"t{round_}",
                                                          status="queued", created_at=float(copy)))
        claimed: list[int] = []
        async with anyio.create_task_group() as tg:
            for n in range(2):
                tg.start_soon(_claim_into, db, f"w{n}", claimed)
        assert len(claimed) == 1, f"round {round_}: two jobs of one session run at once"


async def _claim_into(db: Database, owner: str, claimed: list[int]) -> None:
    job = await claim_job(db, owner=owner, lease_s=30)
    if job is not None:
        claimed.append(job.id)
