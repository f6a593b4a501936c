"""A ledger entry's result is stored once and bounded: a large one goes to the blob store, is
read back for a reuse, and is kept by the blob garbage collector while an entry references it."""

from __future__ import annotations

import dataclasses

import pytest

from cairn.engine.blob_gc import collect_blob_garbage
from cairn.engine.ledger import resolve_effect, sweep_ledger
from cairn.store.approvals import Decider
from tests.unit.engine.harness import EngineHarness
from tests.unit.engine.ledger.ledger_harness import Deployer, crash_worker, entry, open_ledger, start_deploy

pytestmark = pytest.mark.anyio

BIG = "x" * 5000


async def test_a_large_result_is_a_blob_the_entry_references_and_a_reuse_reads_back(engine: EngineHarness) -> None:
    engine.settings = dataclasses.replace(engine.settings, ledger_result_inline_bytes=1024, blob_gc_grace_s=0)
    deployer = Deployer()
    deployer.output = "{release}:" + BIG
    await open_ledger(engine, deployer)
    session_id = await start_deploy(engine, "deploy_unprobed")
    await crash_worker(engine, deployer)
    await open_ledger(engine, deployer)
    await engine.run_job()  # uncertain: a person resolves it with the large result
    found = await entry(engine)
    resolved = await resolve_effect(engine.runtime.journal, engine.runtime.blobs, engine.runtime.sealer,
                                    Decider("key_ops", "t1", "admin"), found.operation_key, output="by hand:" + BIG, inline_bytes=1024)
    assert resolved.result is not None and resolved.result_blob == resolved.result["blob"] and resolved.result["sealed"] is True
    # The blob holds the sealed result: its name and content say nothing of it.
    stored = b"".join(engine.runtime.blobs.iter_chunks(resolved.result_blob))
    assert resolved.result["size"] == len(stored) and b"by hand" not in stored and BIG.encode()[:64] not in stored

    report = await collect_blob_garbage(engine.runtime.db, engine.runtime.blobs, grace_s=0)
    assert report.blobs_deleted == 0  # referenced by the entry
    await engine.run_job()  # the reuse reads the blob
    output = next(i for i in await engine.items(session_id) if i.type == "function_call_output")
    assert output.data["output"] == "by hand:" + BIG

    # Past its retention, with its turn over, the entry is swept, and then the blob.
    engine.settings = dataclasses.replace(engine.settings, ledger_retention_s=0)
    await open_ledger(engine, deployer)
    assert await sweep_ledger(engine.runtime) == 1
    report = await collect_blob_garbage(engine.runtime.db, engine.runtime.blobs, grace_s=0)
    assert report.blobs_deleted == 1


async def test_a_small_result_stays_in_the_entry(engine: EngineHarness) -> None:
    deployer = Deployer()
    await open_ledger(engine, deployer)
    await start_deploy(engine, "deploy_release")
    await engine.run_job()
    found = await entry(engine)
    assert (found.result, found.result_blob) == ({"output": "deployed:r-1"}, None)
