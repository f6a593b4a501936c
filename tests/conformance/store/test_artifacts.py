"""Artifact rows as blob garbage collection sees them, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import hashlib
import time

import pytest

from cairn.ids import new_artifact_id, new_session_id, new_turn_id
from cairn.store.artifacts import ArtifactRecord, delete_artifact, insert_artifact, referenced_digests
from cairn.store.db import Database
from cairn.store.sessions import SessionRecord, delete_session, insert_session

pytestmark = pytest.mark.anyio


def _digest(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


async def _artifact(db: Database, tenant: str, content: str) -> ArtifactRecord:
    now = time.time()
    session = SessionRecord(
        id=new_session_id(), tenant=tenant, status="idle", agent={"model": "scripted:x"}, environment={"type": "none"},
        environment_id="env_1", metadata={}, error=None, usage=None, last_event_seq=0, next_turn_ordinal=0,
        outputs_manifest={}, created_at=now, last_active_at=now,
    )
    record = ArtifactRecord(
        id=new_artifact_id(), session_id=session.id, tenant=tenant, turn_id=new_turn_id(), environment_id="env_1",
        path="/workspace/outputs/a.txt", size_bytes=len(content), sha256=_digest(content), created_at=now,
    )
    async with db.write() as conn:
        await insert_session(conn, session)
        await insert_artifact(conn, record)
    return record


async def test_referenced_digests_span_every_session_and_tenant_until_the_last_row_goes(db: Database) -> None:
    first = await _artifact(db, "acme", "shared")
    second = await _artifact(db, "globex", "shared")
    other = await _artifact(db, "acme", "other")
    unknown = _digest("never published")
    async with db.read() as conn:
        assert await referenced_digests(conn, []) == set()
        assert await referenced_digests(conn, [first.sha256, other.sha256, unknown]) == {first.sha256, other.sha256}

    async with db.write() as conn:
        await delete_session(conn, first.session_id)  # its rows go with it
        await delete_artifact(conn, other.id)
    async with db.read() as conn:
        assert await referenced_digests(conn, [first.sha256, other.sha256]) == {second.sha256}
    async with db.write() as conn:
        await delete_artifact(conn, second.id)
    async with db.read() as conn:
        assert await referenced_digests(conn, [first.sha256]) == set()
