"""A ledger entry's result: stored once, bounded, sealed at rest (design invariant 6).

A result is sealed for its entry (`cairn.durable.sealing`: a fresh data key, associated data
binding the tenant, kind `tool_result` and the operation key), its data key stored in the
transaction that stores the result. Up to `Settings.ledger_result_inline_bytes` (UTF-8, in
clear) it is kept in the entry as `{"sealed": base64}`; a larger one goes to the
content-addressed blob store, which holds only the sealed bytes (so a blob's name, their
SHA-256, says nothing of the result), and the entry keeps `{"blob": sha256, "size": n,
"sealed": true}` (and the digest in `result_blob`, which the blob garbage collector reads,
so a referenced result is never collected). The blob is stored under the publish lock of
the transaction that references it (`cairn.store.blob_locks`): a sweep either finishes
before it, or sees the reference.

A result that does not open (altered, truncated, moved to another entry or tenant, its data
key shredded, another master key) raises `StateDeserializeError`: the call is not finished
with it and the turn fails. Results stored before sealing (migration 0010: `{"output": …}`,
or a blob without `sealed`) are read in clear: reusing one never runs anything, and the
retention sweep deletes them (docs/security.md, "Rows from before sealing").
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping
from typing import Any

from cairn._concurrency import run_sync
from cairn.blobs import BlobStore
from cairn.durable.crypto import SealScope
from cairn.durable.sealing import Sealer
from cairn.errors import BlobStoreError, StateDeserializeError
from cairn.store.blob_locks import hold_publish_lock
from cairn.store.db import Connection
from cairn.store.ledger import LedgerEntry

__all__ = ["TOOL_RESULT_KIND", "load_output", "result_scope", "shown_result", "store_output"]

# The kind of record a sealed tool result belongs to.
TOOL_RESULT_KIND = "tool_result"


def result_scope(entry: LedgerEntry) -> SealScope:
    return SealScope(tenant=entry.tenant, kind=TOOL_RESULT_KIND, record_id=entry.operation_key)


async def store_output(
    conn: Connection, blobs: BlobStore, sealer: Sealer, entry: LedgerEntry, output: str, *, inline_bytes: int
) -> tuple[dict[str, Any], str | None]:
    """The result to store for `output`, sealed for `entry`, and the blob it went to (None when
    kept inline); call it inside the write transaction that stores the result."""
    data = output.encode()
    sealed = await sealer.seal(conn, data, result_scope(entry))
    if len(data) <= inline_bytes:
        return {"sealed": base64.b64encode(sealed).decode()}, None
    await hold_publish_lock(conn)
    sha256, size = await run_sync(blobs.put_stream, io.BytesIO(sealed))
    return {"blob": sha256, "size": size, "sealed": True}, sha256


async def _read_blob(blobs: BlobStore, sha256: str) -> bytes:
    try:
        return await run_sync(lambda: b"".join(blobs.iter_chunks(sha256)))
    except OSError as exc:
        raise BlobStoreError(f"the stored result in blob {sha256} cannot be read: {exc}") from exc


async def load_output(conn: Connection, blobs: BlobStore, sealer: Sealer, entry: LedgerEntry) -> str:
    """The output `entry`'s stored result holds, opened for the entry (read from its blob when
    it has one); `StateDeserializeError` when it does not open."""
    result = entry.result
    if result is None:
        return ""
    if "blob" in result:
        data = await _read_blob(blobs, str(result["blob"]))
        if not result.get("sealed"):
            return data.decode()  # stored before sealing
    elif "sealed" in result:
        try:
            data = base64.b64decode(str(result["sealed"]), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise StateDeserializeError(f"the sealed result of ledger entry {entry.operation_key} is not base64") from exc
    else:
        return str(result.get("output") or "")  # stored before sealing
    plaintext = await sealer.open(conn, data, result_scope(entry))
    try:
        return plaintext.decode()
    except UnicodeDecodeError as exc:  # verified bytes that are not text: sealed by a bug
        raise StateDeserializeError(f"the sealed result of ledger entry {entry.operation_key} is not text") from exc


async def shown_result(conn: Connection, blobs: BlobStore, sealer: Sealer, entry: LedgerEntry) -> Mapping[str, Any] | None:
    """The result as the API shows it: `{"output": …}` for one kept inline, `{"blob", "size"}`
    for a large one, `{"unreadable": why}` for one that does not open."""
    result = entry.result
    if result is None or "blob" in result:
        return None if result is None else {"blob": result["blob"], "size": result.get("size")}
    try:
        return {"output": await load_output(conn, blobs, sealer, entry)}
    except StateDeserializeError as exc:
        return {"unreadable": exc.code}
