"""Blob garbage collection frees unreferenced artifact content, and never content that an
artifact row references or that a turn is publishing right now (real databases; the race
tests run on SQLite and PostgreSQL)."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from cairn.blobs import CONDEMNED_PREFIX, INCOMING_PREFIX, BlobFile, BlobStore
from cairn.engine import blob_gc
from cairn.engine.artifacts import PublishedOutput, collect_outputs, record_outputs
from cairn.engine.blob_gc import BlobGcReport, collect_blob_garbage
from cairn.engine.workspace_files import WorkspaceFiles
from cairn.errors import BlobStoreError, InvalidRequestError
from cairn.ids import new_session_id, new_turn_id
from cairn.store.artifacts import ArtifactRecord, delete_artifact, list_artifacts
from cairn.store.db import Connection, Database
from cairn.store.sessions import SessionRecord, delete_session, get_session, insert_session
from tests.lock_waits import LockWaits

pytestmark = pytest.mark.anyio


@pytest.fixture
def blobs(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


async def _new_session(db: Database, tenant: str = "t1") -> SessionRecord:
    now = time.time()
    record = SessionRecord(
        id=new_session_id(), tenant=tenant, status="idle", agent={"model": "scripted:x"},
        environment={"type": "openai_hosted"}, environment_id="env_1", metadata={}, error=None, usage=None,
        last_event_seq=0, next_turn_ordinal=0, outputs_manifest={}, created_at=now, last_active_at=now,
    )
    async with db.write() as conn:
        await insert_session(conn, record)
    return record


async def _collect(blobs: BlobStore, workspace: Path, session: SessionRecord, content: bytes) -> list[PublishedOutput]:
    """A turn's first half: its output's content goes to the blob store."""
    (workspace / "outputs").mkdir(parents=True, exist_ok=True)
    (workspace / "outputs" / "out.txt").write_bytes(content)
    return await collect_outputs(WorkspaceFiles(workspace), blobs, session)


async def _record(conn: Connection, session: SessionRecord, outputs: list[PublishedOutput]) -> list[ArtifactRecord]:
    """The second half: the artifact rows, in the turn's write transaction."""
    return await record_outputs(conn, session, new_turn_id(), outputs)


async def _publish(db: Database, blobs: BlobStore, tmp_path: Path, content: bytes, tenant: str = "t1") -> ArtifactRecord:
    session = await _new_session(db, tenant)
    outputs = await _collect(blobs, tmp_path / session.id, session, content)
    async with db.write() as conn:
        (record,) = await _record(conn, session, outputs)
    return record


def _age(blobs: BlobStore, sha256: str, seconds: float = 7200) -> None:
    then = time.time() - seconds
    os.utime(blobs.path_of(sha256), (then, then))


def _stored(blobs: BlobStore, content: bytes) -> bool:
    return blobs.path_of(hashlib.sha256(content).hexdigest()).is_file()


async def _gc(db: Database, blobs: BlobStore, grace_s: float = 3600, **kwargs: bool) -> BlobGcReport:
    return await collect_blob_garbage(db, blobs, grace_s=grace_s, **kwargs)


async def _delete(db: Database, record: ArtifactRecord) -> None:
    async with db.write() as conn:
        await delete_artifact(conn, record.id)


async def test_a_deleted_artifact_s_content_is_freed_once_the_grace_period_has_passed(
    db: Database, blobs: BlobStore, tmp_path: Path
) -> None:
    record = await _publish(db, blobs, tmp_path, b"tree.py content")
    await _delete(db, record)
    assert (await _gc(db, blobs)).blobs_deleted == 0, "stored moments ago: within the grace period"
    assert _stored(blobs, b"tree.py content")

    _age(blobs, record.sha256)
    report = await _gc(db, blobs)
    assert report == BlobGcReport(blobs_scanned=1, blobs_deleted=1, bytes_freed=len(b"tree.py content"))
    assert not _stored(blobs, b"tree.py content")
    assert [p.name for p in blobs.root.iterdir() if p.is_file()] == [], "nothing left aside"
    assert await _gc(db, blobs) == BlobGcReport()


@pytest.mark.postgres
async def test_content_shared_across_tenants_is_kept_while_any_artifact_references_it(
    db: Database, blobs: BlobStore, tmp_path: Path
) -> None:
    first = await _publish(db, blobs, tmp_path, b"same bytes", tenant="acme")
    second = await _publish(db, blobs, tmp_path, b"same bytes", tenant="globex")
    referenced = await _publish(db, blobs, tmp_path, b"other bytes")
    assert first.sha256 == second.sha256
    _age(blobs, first.sha256)
    _age(blobs, referenced.sha256)

    async with db.write() as conn:
        await delete_session(conn, first.session_id)  # its artifact rows go with it
    assert (await _gc(db, blobs, grace_s=0)).blobs_deleted == 0
    assert _stored(blobs, b"same bytes")

    await _delete(db, second)
    report = await _gc(db, blobs, grace_s=0)
    assert (report.blobs_scanned, report.blobs_deleted, report.bytes_freed) == (2, 1, len(b"same bytes"))
    assert not _stored(blobs, b"same bytes") and _stored(blobs, b"other bytes")


async def test_an_unreferenced_blob_younger_than_the_grace_period_is_kept(db: Database, blobs: BlobStore, tmp_path: Path) -> None:
    # A turn between storing its outputs and recording them: no row references the content yet.
    session = await _new_session(db)
    outputs = await _collect(blobs, tmp_path / "ws", session, b"in flight")
    assert (await _gc(db, blobs)).blobs_deleted == 0
    async with db.write() as conn:
        await _record(conn, session, outputs)
    assert _stored(blobs, b"in flight")


@pytest.mark.postgres
async def test_a_sweep_waits_for_a_publish_in_flight_and_keeps_its_content(
    db: Database, database_url: str, blobs: BlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The content is old enough to collect, so only the sweep lock protects it: the sweep's
    first look finds no row (not committed yet); it must wait for the publish, then see it."""
    session = await _new_session(db)
    outputs = await _collect(blobs, tmp_path / "ws", session, b"racing")
    _age(blobs, outputs[0].sha256)
    sweeper = Database(database_url)  # as if in another server process
    looked = anyio.Event()
    lookup = blob_gc.referenced_digests

    async def first_look(conn: Connection, digests: list[str]) -> set[str]:
        found = await lookup(conn, digests)
        looked.set()
        return found

    monkeypatch.setattr(blob_gc, "referenced_digests", first_look)
    report: list[BlobGcReport] = []

    async def sweep() -> None:
        report.append(await collect_blob_garbage(sweeper, blobs, grace_s=3600))

    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                async with db.write() as conn:
                    await _record(conn, session, outputs)
                    with LockWaits() as waits:
                        tg.start_soon(sweep)
                        await looked.wait()
                        await waits.until_another_waits(db, "the sweep to wait for the publish lock")
        assert report[0].blobs_deleted == 0
        assert _stored(blobs, b"racing")
    finally:
        await sweeper.dispose()


@pytest.mark.postgres
async def test_a_publish_that_finds_its_content_collected_fails_and_records_nothing(
    db: Database, blobs: BlobStore, tmp_path: Path
) -> None:
    """A publish slower than the grace period: its turn fails, and no row points at nothing."""
    session = await _new_session(db)
    outputs = await _collect(blobs, tmp_path / "ws", session, b"too slow")
    _age(blobs, outputs[0].sha256)  # stored two hours before the turn gets to record it
    assert (await _gc(db, blobs)).blobs_deleted == 1
    with pytest.raises(BlobStoreError, match="deleted before the turn recorded it"):
        async with db.write() as conn:
            await _record(conn, session, outputs)
    async with db.read() as conn:
        page = await list_artifacts(conn, session.id, environment_id=None, after=None, order="asc", limit=10)
        current = await get_session(conn, session.id)
    assert page.data == [] and current is not None and current.outputs_manifest == {}


@pytest.mark.parametrize("stored_again", ["before the move", "after the move"])
async def test_content_stored_again_while_a_sweep_moves_it_is_kept(
    db: Database, blobs: BlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stored_again: str
) -> None:
    """A turn stores content that an old, unreferenced blob already holds, just before or just
    after the sweep moves that blob aside: the turn's copy survives."""
    content = stored_again.encode()
    record = await _publish(db, blobs, tmp_path, content)
    await _delete(db, record)
    _age(blobs, record.sha256)
    condemn = blobs.condemn

    def racing(sha256: str, cutoff: float) -> BlobFile | None:
        if stored_again == "before the move":
            blobs.put_stream(io.BytesIO(content))
        moved = condemn(sha256, cutoff)
        if stored_again == "after the move":
            blobs.put_stream(io.BytesIO(content))
        return moved

    monkeypatch.setattr(blobs, "condemn", racing)
    report = await _gc(db, blobs)
    assert report.blobs_deleted == (0 if stored_again == "before the move" else 1)
    assert b"".join(blobs.iter_chunks(record.sha256)) == content


async def test_abandoned_incoming_files_and_leftovers_of_a_dead_sweep_are_cleaned(
    db: Database, blobs: BlobStore, tmp_path: Path
) -> None:
    record = await _publish(db, blobs, tmp_path, b"kept")
    stale, fresh = blobs.root / f"{INCOMING_PREFIX}stale", blobs.root / f"{INCOMING_PREFIX}fresh"
    stale.write_bytes(b"12345")
    fresh.write_bytes(b"writing")
    then = time.time() - 7200
    os.utime(stale, (then, then))
    # A sweep died after moving blobs aside: an old copy to delete, and a young one that a
    # publish may count on, to put back.
    old_aside = blobs.root / f"{CONDEMNED_PREFIX}{'a' * 64}.dead"
    old_aside.write_bytes(b"old")
    os.utime(old_aside, (then, then))
    young = await _publish(db, blobs, tmp_path, b"young")
    young_aside = blobs.root / f"{CONDEMNED_PREFIX}{young.sha256}.dead"
    os.rename(blobs.path_of(young.sha256), young_aside)

    assert (await _gc(db, blobs, dry_run=True)).temp_files_removed == 2
    assert stale.exists() and old_aside.exists()
    report = await _gc(db, blobs)
    assert (report.temp_files_removed, report.bytes_freed, report.blobs_deleted) == (2, 8, 0)
    assert not stale.exists() and not old_aside.exists() and fresh.exists()
    assert _stored(blobs, b"young") and not young_aside.exists()
    assert _stored(blobs, b"kept") and record.sha256


async def test_a_dry_run_reports_what_a_sweep_would_free_and_deletes_nothing(
    db: Database, blobs: BlobStore, tmp_path: Path
) -> None:
    doomed = [await _publish(db, blobs, tmp_path, f"doomed {i}".encode()) for i in range(3)]
    kept = await _publish(db, blobs, tmp_path, b"kept")
    for record in [*doomed, kept]:
        _age(blobs, record.sha256)
    for record in doomed:
        await _delete(db, record)

    dry = await _gc(db, blobs, dry_run=True)
    assert dry == BlobGcReport(dry_run=True, blobs_scanned=4, blobs_deleted=3, bytes_freed=3 * len(b"doomed 0"))
    assert all(_stored(blobs, f"doomed {i}".encode()) for i in range(3))
    real = await _gc(db, blobs)
    assert (real.blobs_deleted, real.bytes_freed) == (dry.blobs_deleted, dry.bytes_freed)


async def test_references_are_looked_up_in_batches(
    db: Database, blobs: BlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blob_gc, "_BATCH", 2)
    records = [await _publish(db, blobs, tmp_path, bytes([i]) * 64) for i in range(7)]
    for record in records:
        _age(blobs, record.sha256)
    for record in records[::2]:
        await _delete(db, record)
    report = await _gc(db, blobs)
    assert (report.blobs_scanned, report.blobs_deleted) == (7, 4)
    assert [_stored(blobs, bytes([i]) * 64) for i in range(7)] == [i % 2 == 1 for i in range(7)]


async def test_a_blob_that_cannot_be_deleted_is_logged_and_the_sweep_goes_on(
    db: Database, blobs: BlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    refuse_rename: Callable[[Path], None],
) -> None:
    records = [await _publish(db, blobs, tmp_path, f"blob {i}".encode()) for i in range(3)]
    for record in records:
        _age(blobs, record.sha256)
        await _delete(db, record)
    stuck = blobs.path_of(records[1].sha256)
    refuse_rename(stuck)
    with caplog.at_level(logging.WARNING, logger="cairn.engine.blob_gc"):
        report = await _gc(db, blobs)
    assert (report.blobs_deleted, report.failures) == (2, 1)
    assert stuck.exists() and any("Permission denied" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    assert (await _gc(db, blobs)).blobs_deleted == 1, "the next sweep gets it"


async def test_a_grace_period_must_be_seconds_zero_or_more(db: Database, blobs: BlobStore) -> None:
    for grace_s in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidRequestError, match="grace_s"):
            await _gc(db, blobs, grace_s=grace_s)
