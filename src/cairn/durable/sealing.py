"""Blobs sealed for a record, with their data keys in the database (design invariant 6).

`Sealer.seal` encrypts a blob under a new data key (`cairn.durable.crypto`) and stores the
wrapped key in the same transaction as whatever stores the blob, so a blob and its key are
committed together or not at all. `Sealer.open` finds the key the blob names and opens the
blob for the record it is read as; anything else (an altered, truncated or moved blob, a key
row gone or moved, another master key) is a `StateDeserializeError`.

Deleting a record's data keys ("shredding") makes its blobs unreadable wherever a copy
remains: in a backup, in the free pages of a database file, in an object store.
"""

from __future__ import annotations

import json
import time
from typing import Any

from cairn.durable.crypto import Envelope, KeyProvider, SealScope, WrappedKey, blob_key_id
from cairn.errors import StateDeserializeError
from cairn.store.data_keys import DataKeyRecord, delete_data_keys, delete_record_keys, get_data_key, insert_data_key
from cairn.store.db import Connection

__all__ = ["Sealer"]


class Sealer:
    """Seals and opens blobs of records; one per process, over the deployment's master keys."""

    def __init__(self, keys: KeyProvider) -> None:
        self.envelope = Envelope(keys)

    @property
    def keys(self) -> KeyProvider:
        return self.envelope.keys

    async def seal(self, conn: Connection, plaintext: bytes, scope: SealScope) -> bytes:
        """`plaintext` sealed for `scope`; its data key is stored in `conn`'s transaction."""
        sealed = await self.envelope.seal(plaintext, scope)
        await insert_data_key(
            conn,
            DataKeyRecord(
                id=sealed.data_key.id,
                tenant=scope.tenant,
                kind=scope.kind,
                record_id=scope.record_id,
                key_version=sealed.data_key.key.version,
                wrapped=sealed.data_key.key.wrapped,
                created_at=time.time(),
            ),
        )
        return sealed.blob

    async def open(self, conn: Connection, blob: bytes, scope: SealScope) -> bytes:
        """The plaintext of `blob`, read as `scope`'s; `StateDeserializeError` otherwise."""
        key_id = blob_key_id(blob)
        record = await get_data_key(conn, key_id)
        where = {"kind": scope.kind, "record_id": scope.record_id}
        if record is None:
            raise StateDeserializeError(
                f"the sealed {scope.describe()} cannot be opened: its data key is gone (shredded with its record, "
                "or the blob was copied from elsewhere)",
                context=where,
            )
        if (record.tenant, record.kind, record.record_id) != (scope.tenant, scope.kind, scope.record_id):
            raise StateDeserializeError(
                f"the sealed {scope.describe()} cannot be opened: it names the data key of another record", context=where
            )
        return await self.envelope.open(blob, WrappedKey(record.key_version, record.wrapped), scope)

    async def seal_json(self, conn: Connection, value: Any, scope: SealScope) -> bytes:
        return await self.seal(conn, json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode(), scope)

    async def open_json(self, conn: Connection, blob: bytes, scope: SealScope) -> Any:
        plaintext = await self.open(conn, blob, scope)
        try:
            return json.loads(plaintext)
        except ValueError as exc:  # verified bytes that are not JSON: sealed by a bug, never by a user
            raise StateDeserializeError(f"the sealed {scope.describe()} is not JSON", context={"kind": scope.kind}) from exc

    async def shred(self, conn: Connection, *blobs: bytes | None) -> int:
        """Delete the data keys of these blobs (None is skipped): they can never be opened again."""
        return await delete_data_keys(conn, [blob_key_id(b) for b in blobs if b is not None])

    async def shred_records(self, conn: Connection, kind: str, *record_ids: str) -> int:
        """Delete the data keys of every blob of these records."""
        return await delete_record_keys(conn, kind, record_ids)

