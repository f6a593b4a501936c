"""No job and no background task can stop a worker process's work (issue 19).

A real SQLite database and scripted model; the worker's tasks run as `cairn serve` runs them
(`start_worker_tasks`). Waits are on database state, with deadlines that fail loudly.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import anyio
import pytest
import sqlalchemy as sa

from cairn.config import Settings
from cairn.engine.runtime import Runtime
from cairn.engine.sessions import SessionService
from cairn.store.events import read_events_after
from cairn.store.tables import jobs
from cairn.store.turns import get_turn
from cairn.worker import runner as runner_module
from cairn.worker import service as service_module
from cairn.worker.service import start_worker_tasks
from tests.runtimes import scratch_runtime
from tests.waits import until

pytestmark = pytest.mark.anyio


@pytest.fixture
async def runtime() -> AsyncIterator[Runtime]:
    settings = {
        "job_max_attempts": 3, "job_retry_delay_s": 0.01, "poll_interval_s": 0.02,
        "idle_stop_s": 0.8, "snapshot_gc_interval_s": 0.05, "blob_gc_interval_s": 0.05,
    }
    async with scratch_runtime("cairn-worker-", **settings) as built:
        assert built.settings.scripts_dir is not None
        (built.settings.scripts_dir / "hello.json").write_text(json.dumps({"turns": [[{"say": "hello"}]] * 4}))
        yield built


async def _start_turn(runtime: Runtime, text: str) -> str:
    message = {"role": "user", "content": [{"type": "input_text", "text": text}]}
    created = await SessionService(runtime).create(
        "t1", {"agent": {"model": "scripted:hello"}, "environment": {"type": "none"}, "input": [message]}
    )
    assert created.turn_id is not None
    return created.turn_id


async def _turn_status(runtime: Runtime, turn_id: str) -> str | None:
    async with runtime.db.read() as conn:
        turn = await get_turn(conn, turn_id)
    return None if turn is None else turn.status


async def _job_rows(runtime: Runtime, turn_id: str) -> list[tuple[str, int, str | None]]:
    async with runtime.db.read() as conn:
        rows = (await conn.execute(sa.select(jobs.c.status, jobs.c.attempts, jobs.c.last_error).where(jobs.c.turn_id == turn_id))).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


async def test_a_job_that_always_raises_is_retried_then_parked_and_its_turn_failed(runtime: Runtime) -> None:
    # A lone surrogate reached the store before the API refused it: the worker's first write of
    # the turn's input raised UnicodeEncodeError, escaped the worker and stopped every later turn.
    poisoned = await _start_turn(runtime, "x\ud800y")
    async with anyio.create_task_group() as tg:
        start_worker_tasks(tg, runtime, concurrency=2)
        await until(lambda: _is(runtime, poisoned, "failed"), "the poisoned turn to fail", timeout_s=30)
        later = await _start_turn(runtime, "a later turn")
        await until(lambda: _is(runtime, later, "completed"), "a later turn to complete", timeout_s=30)
        tg.cancel_scope.cancel()
    [(status, attempts, error)] = await _job_rows(runtime, poisoned)
    assert (status, attempts) == ("parked", 3)
    assert error is not None and "UnicodeEncodeError" in error
    turn = await _get(runtime, poisoned)
    assert turn.error is not None and turn.error["code"] == "internal_error" and "3 times" in turn.error["message"]
    async with runtime.db.read() as conn:
        events = await read_events_after(conn, turn.session_id, 0, limit=100)
    assert [e.type for e in events][-2:] == ["agent.session.turn.failed", "agent.session.idle"]


async def test_a_job_whose_worker_keeps_dying_is_given_up_on_at_its_next_claim(runtime: Runtime) -> None:
    turn_id = await _start_turn(runtime, "hi")
    # As if three workers had claimed it and died: the next claim is its fourth attempt.
    async with runtime.db.write() as conn:
        await conn.execute(sa.update(jobs).where(jobs.c.turn_id == turn_id).values(attempts=3))
    async with anyio.create_task_group() as tg:
        start_worker_tasks(tg, runtime, concurrency=1)
        await until(lambda: _is(runtime, turn_id, "failed"), "the turn to fail", timeout_s=30)
        tg.cancel_scope.cancel()
    [(status, attempts, error)] = await _job_rows(runtime, turn_id)
    assert (status, attempts) == ("parked", 4) and error is not None and "interrupted 3 times" in error


async def test_every_background_task_carries_on_after_failures(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"idle-sessions": 0, "snapshot-gc": 0, "blob-gc": 0, "claim": 0}

    def failing(name: str, real: Callable[..., Awaitable[object]] | None = None) -> Callable[..., Awaitable[object]]:
        async def step(*args: object, **kwargs: object) -> object:
            calls[name] += 1
            if real is not None and calls[name] > 2:
                return await real(*args, **kwargs)
            raise RuntimeError(f"injected failure in {name}")

        return step

    monkeypatch.setattr(service_module, "suspend_idle_sessions", failing("idle-sessions"))
    monkeypatch.setattr(service_module, "apply_snapshot_retention", failing("snapshot-gc"))
    monkeypatch.setattr(service_module, "sweep_blob_garbage", failing("blob-gc"))
    # The job loop's own claim fails twice, then works: the loop must survive it.
    monkeypatch.setattr(runner_module, "claim_job", failing("claim", runner_module.claim_job))
    poisoned = await _start_turn(runtime, "x\ud800y")
    async with anyio.create_task_group() as tg:
        start_worker_tasks(tg, runtime, concurrency=2)
        await until(_every_task_ran_thrice(calls), "each periodic task to run again after failing", timeout_s=30)
        await until(lambda: _is(runtime, poisoned, "failed"), "the poisoned turn to fail", timeout_s=30)
        later = await _start_turn(runtime, "a later turn")
        await until(lambda: _is(runtime, later, "completed"), "a later turn to complete", timeout_s=30)
        tg.cancel_scope.cancel()


def _every_task_ran_thrice(calls: dict[str, int]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return all(count >= 3 for count in calls.values())

    return check


async def _is(runtime: Runtime, turn_id: str, status: str) -> bool:
    return await _turn_status(runtime, turn_id) == status


async def _get(runtime: Runtime, turn_id: str):  # type: ignore[no-untyped-def]
    async with runtime.db.read() as conn:
        turn = await get_turn(conn, turn_id)
    assert turn is not None
    return turn


async def test_settings_refuse_a_job_bound_below_one() -> None:
    with pytest.raises(Exception, match="CAIRN_JOB_MAX_ATTEMPTS"):
        replace(Settings(), job_max_attempts=0)
