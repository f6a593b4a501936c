"""The idempotency ledger in the loop (design invariant 5): every side-effecting call runs
under an entry, at most once, whatever dies when; a retryable failure is retried with backoff
up to its limit; an outcome nobody can know holds the turn as `uncertain` until a person
resolves it. The deploy system outside Cairn (`Deployer`) counts the real executions."""

from __future__ import annotations

import anyio
import pytest
import sqlalchemy as sa

import cairn
from cairn.engine.ledger import resolve_effect, stage
from cairn.engine.loop import TurnRunner
from cairn.engine.sessions import SessionService
from cairn.errors import ConflictError, PermissionDeniedError
from cairn.store.approvals import Decider
from cairn.store.items import ItemRecord
from cairn.store.jobs import Job
from cairn.store.tables import items as items_table
from cairn.store.tables import jobs, ledger_entries
from tests.unit.engine.approvals.approval_harness import approval_of, approvals, approve, key
from tests.unit.engine.harness import EngineHarness
from tests.unit.engine.ledger.ledger_harness import Deployer, call, crash_worker, entries, entry, open_ledger, start_deploy

pytestmark = pytest.mark.anyio

OPS = Decider(key_id="key_ops", tenant="t1", role="approver")


def _call_items(items: list[ItemRecord]) -> list[ItemRecord]:
    return [i for i in items if i.call_id is not None and i.type != "function_call_output"]


async def _result(engine: EngineHarness, session_id: str) -> tuple[str, str | None, str | None]:
    """The call's status, and its output or error."""
    found = await engine.items(session_id)
    output = next(i for i in found if i.type == "function_call_output")
    return output.status, output.data.get("output"), output.data.get("error")


async def test_a_side_effect_runs_once_under_its_entry_and_its_item_says_so(engine: EngineHarness) -> None:
    deployer = Deployer()
    await open_ledger(engine, deployer)
    session_id = await start_deploy(engine, "deploy_release")
    await engine.run_job()

    found = await entry(engine)
    assert deployer.deployed == [("r-1", found.operation_key)] and found.operation_key.startswith("op_")
    assert (found.status, found.attempts, found.reuses, found.result) == ("succeeded", 1, 0, {"output": "deployed:r-1"})
    assert (found.session_id, found.turn_id, found.tool_name, found.approval_id) == (
        session_id, engine.turn_ids[session_id], "deploy_release", None)
    [item] = _call_items(await engine.items(session_id))
    assert item.data["ledger"] == {"operation_key": found.operation_key, "reused": False, "attempts": 1}
    assert await _result(engine, session_id) == ("completed", "deployed:r-1", None)
    assert (await engine.turn(engine.turn_ids[session_id])).status == "completed"


async def test_the_operation_key_depends_on_the_target_never_on_what_the_model_chose_as_a_note(engine: EngineHarness) -> None:
    deployer = Deployer()
    await open_ledger(engine, deployer)
    engine.script([{"calls": [call("deploy_release", release="r-1", note="a"), call("deploy_release", release="r-2")]},
                   {"say": "shipped"}])
    await engine.create_session(agent_id="release-agent")
    await engine.run_job()
    first, second = await entries(engine)
    assert first.operation_key != second.operation_key
    assert [key for _, key in deployer.deployed] == [first.operation_key, second.operation_key]


async def test_killed_after_reserving_the_takeover_runs_it_once(engine: EngineHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    deployer = Deployer()
    await open_ledger(engine, deployer)
    session_id = await start_deploy(engine, "deploy_release")
    crash = anyio.CancelScope()
    start = stage.start_execution

    async def die_before_starting(*args: object, **kwargs: object) -> object:
        crash.cancel()
        await anyio.sleep_forever()

    monkeypatch.setattr(stage, "start_execution", die_before_starting)
    with crash:
        await engine.run_job(lease_s=-1)
    assert crash.cancelled_caught
    assert (await entry(engine)).status == "reserved" and deployer.deployed == []

    monkeypatch.setattr(stage, "start_execution", start)
    await open_ledger(engine, deployer)
    await engine.run_job()
    found = await entry(engine)
    assert (found.status, found.attempts) == ("succeeded", 1) and deployer.deployed == [("r-1", found.operation_key)]
    assert await _result(engine, session_id) == ("completed", "deployed:r-1", None)


async def test_killed_while_the_tool_ran_the_probe_finds_the_effect_and_it_is_not_run_again(engine: EngineHarness) -> None:
    deployer = Deployer()
    await open_ledger(engine, deployer)
    session_id = await start_deploy(engine, "deploy_release")
    await crash_worker(engine, deployer, "after_effect")
    assert (await entry(engine)).status == "executing"

    await open_ledger(engine, deployer)
    await engine.run_job()
    found = await entry(engine)
    assert len(deployer.deployed) == 1
    assert (found.status, found.attempts, found.result) == ("succeeded", 1, {"output": "deployed:r-1 (found by the probe)"})
    assert await _result(engine, session_id) == ("completed", "deployed:r-1 (found by the probe)", None)
    [item] = _call_items(await engine.items(session_id))
    assert item.data["ledger"]["probed"] is True


async def test_killed_before_the_effect_the_probe_finds_nothing_and_it_runs_again_once(engine: EngineHarness) -> None:
    deployer = Deployer()
    await open_ledger(engine, deployer)
    session_id = await start_deploy(engine, "deploy_release")
    await crash_worker(engine, deployer, "before_effect")

    await open_ledger(engine, deployer)
    await engine.run_job()
    found = await entry(engine)
    assert deployer.deployed == [("r-1", found.operation_key)]
    assert (found.status, found.attempts) == ("succeeded", 2)
    assert deployer.keys_seen == [found.operation_key, found.operation_key]  # the same key on every attempt
    assert await _result(engine, session_id) == ("completed", "deployed:r-1", None)


@pytest.mark.parametrize("tool", ["deploy_unprobed", "deploy_release"])
async def test_an_outcome_nobody_can_know_is_uncertain_until_a_person_resolves_it(engine: EngineHarness, tool: str) -> None:
    deployer = Deployer()
    deployer.probe_miss = "the deploy API did not answer"
    await open_ledger(engine, deployer)
    session_id = await start_deploy(engine, tool)
    await crash_worker(engine, deployer, "before_effect" if tool == "deploy_release" else "after_effect")

    await open_ledger(engine, deployer)
    await engine.run_job()
    found = await entry(engine)
    assert found.status == "uncertain" and found.reason is not None
    assert ("has no probe" in found.reason) if tool == "deploy_unprobed" else ("the deploy API did not answer" in found.reason)
    session = await engine.session(session_id)
    assert session.status == "requires_action"
    assert await engine.required_actions(session_id) == [{
        "type": "uncertain_effect", "call_id": found.call_id, "operation_key": found.operation_key, "tool": tool,
        "reason": found.reason, "turn_id": found.turn_id,
    }]
    # No automatic retry, ever: nothing is queued, and a restarted worker runs nothing.
    await open_ledger(engine, deployer)
    assert not await engine.has_job()
    executed = len(deployer.deployed)

    with pytest.raises(PermissionDeniedError):
        await resolve_effect(engine.runtime.journal, engine.runtime.blobs, engine.runtime.sealer, Decider("key_m", "t1", "member"),
                             found.operation_key, output="x", inline_bytes=1024)
    resolved = await resolve_effect(engine.runtime.journal, engine.runtime.blobs, engine.runtime.sealer, OPS, found.operation_key,
                                    output="deployed by hand", inline_bytes=1024)
    assert (resolved.status, resolved.resolved_by) == ("succeeded", "key_ops")
    assert (await entry(engine)).result == {"output": "deployed by hand"}
    with pytest.raises(ConflictError):
        await resolve_effect(engine.runtime.journal, engine.runtime.blobs, engine.runtime.sealer, OPS, found.operation_key, error="no",
                             inline_bytes=1024)
    await engine.run_job()
    assert len(deployer.deployed) == executed
    assert await _result(engine, session_id) == ("completed", "deployed by hand", None)
    [item] = _call_items(await engine.items(session_id))
    assert item.data["ledger"] == {"operation_key": found.operation_key, "reused": True}
    assert (await entry(engine)).reuses == 1
    assert (await engine.turn(engine.turn_ids[session_id])).status == "completed"


async def test_resolved_as_failed_the_call_ends_with_the_persons_message(engine: EngineHarness) -> None:
    deployer = Deployer()
    await open_ledger(engine, deployer)
    session_id = await start_deploy(engine, "deploy_unprobed")
    await crash_worker(engine, deployer, "after_effect")
    await open_ledger(engine, deployer)
    await engine.run_job()
    await resolve_effect(engine.runtime.journal, engine.runtime.blobs, engine.runtime.sealer, OPS, (await entry(engine)).operation_key,
                         error="it never reached production", inline_bytes=1024)
    await engine.run_job()
    assert await _result(engine, session_id) == ("failed", None, "it never reached production")
    assert (await entry(engine)).status == "failed_terminal"


async def _retry_now(engine: EngineHarness) -> Job:
    """The deferred job, claimable now, its entry's retry due (the backoff skipped by the test)."""
    async with engine.runtime.db.write() as conn:
        await conn.execute(sa.update(jobs).values(run_after=None))
        await conn.execute(sa.update(ledger_entries).values(retry_after=0))
    return await engine.claim()


async def test_a_retryable_failure_is_deferred_with_backoff_then_retried_until_it_succeeds(engine: EngineHarness) -> None:
    deployer = Deployer()
    deployer.failures = {"r-1": [cairn.RetryableToolError("503 from the deploy API"), cairn.RetryableToolError("503 again")]}
    await open_ledger(engine, deployer)
    session_id = await start_deploy(engine, "deploy_release")
    await engine.run_job()

    found = await entry(engine)
    assert (found.status, found.attempts, found.error) == ("failed_retryable", 1, "503 from the deploy API")
    [item] = _call_items(await engine.items(session_id))
    assert item.status == "in_progress"  # open and unrecorded
    async with engine.runtime.db.read() as conn:
        queued = (await conn.execute(sa.select(jobs.c.status, jobs.c.run_after, jobs.c.attempts).where(jobs.c.session_id == session_id))).one()
    assert queued.status == "queued" and queued.run_after is not None and queued.attempts == 0
    assert not await engine.has_job()  # not before its backoff

    for expected_attempts in (2, 3):
        job = await _retry_now(engine)
        await TurnRunner(engine.runtime).run(job)
        assert (await entry(engine)).attempts == expected_attempts
    found = await entry(engine)
    assert (found.status, len(deployer.deployed)) == ("succeeded", 1)
    assert await _result(engine, session_id) == ("completed", "deployed:r-1", None)


async def test_retries_stop_at_the_limit_and_a_terminal_failure_is_never_retried(engine: EngineHarness) -> None:
    deployer = Deployer()
    deployer.failures = {"#ops": [cairn.RetryableToolError("busy"), cairn.RetryableToolError("busy")], "r-1": [RuntimeError("bad release")]}
    await open_ledger(engine, deployer)
    engine.script([{"calls": [call("notify", channel="#ops"), call("deploy_release", release="r-1")]}, {"say": "sorry"}])
    session_id = await engine.create_session(agent_id="release-agent")
    await engine.run_job()  # notify: busy (deferred); deploy_release: bad release (terminal)
    await TurnRunner(engine.runtime).run(await _retry_now(engine))  # notify: busy again, its second and last attempt
    notify, deploy = await entries(engine)
    assert (notify.status, notify.attempts, notify.error) == ("failed_terminal", 2, "busy (gave up after 2 attempts)")
    assert (deploy.status, deploy.attempts, deploy.error) == ("failed_terminal", 1, "bad release")
    assert deployer.deployed == [] and len(deployer.keys_seen) == 3
    assert not await engine.has_job()
    assert (await engine.turn(engine.turn_ids[session_id])).status == "completed"


async def test_the_same_key_with_other_arguments_is_refused_and_nothing_runs(engine: EngineHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    deployer = Deployer()
    await open_ledger(engine, deployer)
    engine.script([call("deploy_release", release="r-1", note="first"), {"say": "done"}])
    session_id = await engine.create_session(agent_id="release-agent")
    crash = anyio.CancelScope()

    async def die_before_starting(*args: object, **kwargs: object) -> object:
        crash.cancel()
        await anyio.sleep_forever()

    monkeypatch.setattr(stage, "start_execution", die_before_starting)
    with crash:
        await engine.run_job(lease_s=-1)
    monkeypatch.undo()
    reserved = await entry(engine)
    # Behind Cairn's back, the recorded call's arguments change (its target stays the same).
    [item] = _call_items(await engine.items(session_id))
    changed = {**item.data, "arguments": '{"release": "r-1", "note": "second"}'}
    async with engine.runtime.db.write() as conn:
        await conn.execute(sa.update(items_table).where(items_table.c.id == item.id).values(data=changed))

    await open_ledger(engine, deployer)
    await engine.run_job()
    status, _, error = await _result(engine, session_id)
    assert status == "failed" and error is not None and error.startswith(f"refused: operation {reserved.operation_key}")
    assert deployer.deployed == [] and deployer.keys_seen == []
    # The turn is over: its reservation will never run.
    assert (await entry(engine)).status == "failed_terminal"


async def test_cancelled_while_the_tool_ran_the_entry_is_uncertain(engine: EngineHarness) -> None:
    deployer = Deployer()
    await open_ledger(engine, deployer)
    session_id = await start_deploy(engine, "deploy_unprobed")
    started = anyio.Event()
    deployer.crash_after_effect = started.set  # the tool then blocks, until the cancel stops it
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run_job)
        await started.wait()
        await SessionService(engine.runtime).submit("t1", session_id, [{"type": "agent.session.input.cancel"}], idempotency=None)
    found = await entry(engine)
    assert found.status == "uncertain" and found.reason is not None and "turn ended while the tool ran" in found.reason
    assert (await engine.turn(engine.turn_ids[session_id])).status == "cancelled"


async def test_an_approved_call_that_started_goes_to_the_ledger_which_never_runs_it_twice(engine: EngineHarness) -> None:
    deployer = Deployer()
    await open_ledger(engine, deployer, gated=True)
    session_id = await start_deploy(engine, "deploy_approved", "r-9")
    await engine.run_job()
    [approval] = await approvals(engine, session_id)
    assert await entries(engine) == []  # held for a person: nothing claimed, nothing ran
    await approve(engine, await key(engine), approval)
    await crash_worker(engine, deployer, "after_effect")  # the approval started; the worker died after the effect

    await open_ledger(engine, deployer, gated=True)
    await engine.run_job()
    found = await entry(engine)
    assert found.approval_id == approval.id and len(deployer.deployed) == 1
    assert (found.status, found.result) == ("succeeded", {"output": "deployed:r-9 (found by the probe)"})
    assert (await approval_of(engine, approval.turn_id, approval.call_id)).is_started
    [item] = _call_items(await engine.items(session_id))
    assert (item.type, item.status, item.data["output"]) == ("mcp_call", "completed", "deployed:r-9 (found by the probe)")
