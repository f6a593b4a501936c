"""Sealed blobs with their data keys on SQLite and PostgreSQL: a blob and its key commit
together, open for their record only, are unreadable once shredded, and survive a master key
rotation (re-wrapped keys, blobs untouched), including keys sealed by a process that had not
seen the new version yet."""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa

from cairn.durable.crypto import SealScope
from cairn.durable.keyring import LocalKeyring
from cairn.durable.rotation import rewrap_data_keys
from cairn.durable.sealing import Sealer
from cairn.errors import StateDeserializeError
from cairn.store.data_keys import count_by_version, orphaned_keys
from cairn.store.db import Database
from cairn.store.tables import credentials, data_keys

pytestmark = pytest.mark.anyio


def scope(record_id: str = "apr_1", tenant: str = "t1") -> SealScope:
    return SealScope(tenant=tenant, kind="approval", record_id=record_id)


async def test_a_blob_opens_for_its_record_with_the_key_stored_beside_it(db: Database) -> None:
    sealer = Sealer(LocalKeyring({1: os.urandom(32)}))
    async with db.write() as conn:
        blob = await sealer.seal_json(conn, {"call_id": "call_1"}, scope())
    async with db.read() as conn:
        assert await sealer.open_json(conn, blob, scope()) == {"call_id": "call_1"}
        row = (await conn.execute(sa.select(data_keys))).one()
    assert (row.tenant, row.kind, row.record_id, row.key_version) == ("t1", "approval", "apr_1", 1)


async def test_a_rolled_back_seal_leaves_a_blob_nothing_opens(db: Database) -> None:
    sealer = Sealer(LocalKeyring({1: os.urandom(32)}))
    blob = b""
    with pytest.raises(RuntimeError):
        async with db.write() as conn:
            blob = await sealer.seal(conn, b"state", scope())
            raise RuntimeError("the record's transaction failed")
    async with db.read() as conn:
        with pytest.raises(StateDeserializeError, match="data key is gone"):
            await sealer.open(conn, blob, scope())


async def test_blobs_swapped_between_records_or_tenants_do_not_open(db: Database) -> None:
    sealer = Sealer(LocalKeyring({1: os.urandom(32)}))
    async with db.write() as conn:
        first = await sealer.seal(conn, b"first", scope("apr_1"))
        await sealer.seal(conn, b"second", scope("apr_2"))
        other_tenant = await sealer.seal(conn, b"theirs", scope("apr_1", tenant="t2"))
    async with db.read() as conn:
        with pytest.raises(StateDeserializeError, match="another record"):
            await sealer.open(conn, first, scope("apr_2"))
        with pytest.raises(StateDeserializeError, match="another record"):
            await sealer.open(conn, other_tenant, scope("apr_1"))


async def test_a_shredded_blob_never_opens_again(db: Database) -> None:
    sealer = Sealer(LocalKeyring({1: os.urandom(32)}))
    async with db.write() as conn:
        kept = await sealer.seal(conn, b"kept", scope("apr_1"))
        shredded = await sealer.seal(conn, b"gone", scope("apr_2"))
        by_record = await sealer.seal(conn, b"gone too", scope("apr_3"))
    async with db.write() as conn:
        assert await sealer.shred(conn, shredded, None) == 1
        assert await sealer.shred_records(conn, "approval", "apr_3") == 1
    async with db.read() as conn:
        assert await sealer.open(conn, kept, scope("apr_1")) == b"kept"
        for blob, record in ((shredded, "apr_2"), (by_record, "apr_3")):
            with pytest.raises(StateDeserializeError, match="data key is gone"):
                await sealer.open(conn, blob, scope(record))


async def test_a_rotation_rewraps_every_key_and_leaves_the_blobs_as_they_were(db: Database) -> None:
    old, new = os.urandom(32), os.urandom(32)
    sealer = Sealer(LocalKeyring({1: old}))
    sealed: dict[str, tuple[bytes, bytes]] = {}
    async with db.write() as conn:
        for n in range(7):
            plaintext = f"state {n}".encode()
            sealed[f"apr_{n}"] = (await sealer.seal(conn, plaintext, scope(f"apr_{n}")), plaintext)
    rotated = Sealer(LocalKeyring({1: old, 2: new}))
    # A process that has not seen version 2 yet seals under version 1 meanwhile.
    async with db.write() as conn:
        sealed["apr_late"] = (await sealer.seal(conn, b"late", scope("apr_late")), b"late")
    report = await rewrap_data_keys(db, rotated.envelope, batch=3)
    assert (report.version, report.rewrapped, report.unreadable) == (2, 8, [])
    async with db.read() as conn:
        assert await count_by_version(conn) == {2: 8}
    assert (await rewrap_data_keys(db, rotated.envelope)).rewrapped == 0
    only_new = Sealer(LocalKeyring({2: new}))
    async with db.read() as conn:
        for record, (blob, plaintext) in sealed.items():
            assert await only_new.open(conn, blob, scope(record)) == plaintext  # the blob as it was sealed


async def test_a_key_no_master_key_unwraps_is_reported_and_not_retried(db: Database) -> None:
    lost = Sealer(LocalKeyring({1: os.urandom(32)}))
    async with db.write() as conn:
        await lost.seal(conn, b"sealed under a key nobody has any more", scope())
    report = await rewrap_data_keys(db, Sealer(LocalKeyring({1: os.urandom(32), 2: os.urandom(32)})).envelope)
    assert report.rewrapped == 0 and len(report.unreadable) == 1


async def test_keys_whose_record_is_gone_are_found_as_orphans(db: Database) -> None:
    sealer = Sealer(LocalKeyring({1: os.urandom(32)}))
    async with db.write() as conn:
        await sealer.seal(conn, b"secret", SealScope("t1", "credential", "cred_gone"))
    async with db.read() as conn:
        assert len(await orphaned_keys(conn, "credential", credentials, limit=10)) == 1
        assert await orphaned_keys(conn, "approval", credentials, limit=10) == []
