"""A ledger entry's result is stored once and bounded: a large one goes to the blob store, is
read back for a reuse, and is kept by the blob garbage collector while an entry references it."""

from __future__ import annotations

import base64
import dataclasses

import pytest
import sqlalchemy as sa

from cairn.engine.blob_gc import collect_blob_garbage
from cairn.engine.ledger import resolve_effect, sweep_ledger
from cairn.store.approvals import Decider
from cairn.store.tables import ledger_entries
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


@pytest.mark.parametrize("where", ["inline", "blob"])
async def test_a_stored_result_that_does_not_open_fails_the_turn_and_nothing_runs_again(engine: EngineHarness, where: str) -> None:
    engine.settings = dataclasses.replace(engine.settings, ledger_result_inline_bytes=1024 if where == "blob" else 64 * 1024)
    deployer = Deployer()
    await open_ledger(engine, deployer)
    session_id = await start_deploy(engine, "deploy_unprobed")
    await crash_worker(engine, deployer)
    await open_ledger(engine, deployer)
    await engine.run_job()  # uncertain: a person resolves it, and the turn reuses that result
    found = await entry(engine)
    resolved = await resolve_effect(engine.runtime.journal, engine.runtime.blobs, engine.runtime.sealer,
                                    Decider("key_ops", "t1", "admin"), found.operation_key, output="by hand:" + BIG,
                                    inline_bytes=engine.settings.ledger_result_inline_bytes)
    assert resolved.result is not None
    if where == "blob":
        path = engine.runtime.blobs.path_of(str(resolved.result["blob"]))
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.chmod(0o600)
        path.write_bytes(bytes(data))
    else:
        sealed = bytearray(base64.b64decode(resolved.result["sealed"]))
        sealed[-1] ^= 0x01
        async with engine.runtime.db.write() as conn:
            await conn.execute(sa.update(ledger_entries).where(ledger_entries.c.operation_key == found.operation_key)
                               .values(result={"sealed": base64.b64encode(bytes(sealed)).decode()}))
    executed = len(deployer.deployed)

    await engine.run_job()
    assert len(deployer.deployed) == executed
    turn = await engine.turn(engine.turn_ids[session_id])
    assert turn.status == "failed" and turn.error is not None and turn.error["code"] == "state_deserialize_failure"
    assert f"tool_result {found.operation_key}" in turn.error["message"]
    if where == "inline":
        assert (await entry(engine)).result == {"unreadable": "state_deserialize_failure"}
