"""The retention sweep: settled entries of turns that are over go after the retention period;
an entry whose turn may still run its call, an uncertain one, and a young one stay."""

from __future__ import annotations

import dataclasses

import pytest

from cairn.engine.ledger import sweep_ledger
from tests.unit.engine.harness import EngineHarness
from tests.unit.engine.ledger.ledger_harness import Deployer, crash_worker, entries, open_ledger, start_deploy

pytestmark = pytest.mark.anyio


async def test_only_settled_entries_of_turns_that_are_over_are_swept_after_the_retention(engine: EngineHarness) -> None:
    deployer = Deployer()
    await open_ledger(engine, deployer)
    # A finished turn (its entry settled), then a turn left uncertain.
    await start_deploy(engine, "deploy_release")
    await engine.run_job()
    second = await start_deploy(engine, "deploy_unprobed", "r-2")
    await crash_worker(engine, deployer)
    await open_ledger(engine, deployer)
    await engine.run_job()
    assert [e.status for e in await entries(engine)] == ["succeeded", "uncertain"]

    assert await sweep_ledger(engine.runtime) == 0  # within the retention
    engine.settings = dataclasses.replace(engine.settings, ledger_retention_s=0)
    await open_ledger(engine, deployer)
    assert await sweep_ledger(engine.runtime) == 1
    [kept] = await entries(engine)
    assert (kept.status, kept.session_id) == ("uncertain", second)
