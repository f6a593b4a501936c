"""A ledger entry's result: stored once, bounded.

A result up to `Settings.ledger_result_inline_bytes` (UTF-8) is kept in the entry as
`{"output": text}`; a larger one goes to the content-addressed blob store and the entry
keeps `{"blob": sha256, "size": n}` (and the digest in `result_blob`, which the blob
garbage collector reads, so a referenced result is never collected). The blob is stored
under the publish lock of the transaction that references it (`cairn.store.blob_locks`):
a sweep either finishes before it, or sees the reference.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from cairn._concurrency import run_sync
from cairn.blobs import BlobStore
from cairn.errors import BlobStoreError
from cairn.store.blob_locks import hold_publish_lock
from cairn.store.db import Connection

__all__ = ["load_output", "store_output"]


async def store_output(conn: Connection, blobs: BlobStore, output: str, *, inline_bytes: int) -> tuple[dict[str, Any], str | None]:
    """The result to store for `output`, and the blob it went to (None when kept inline);
    call it inside the write transaction that stores the result."""
    data = output.encode()
    if len(data) <= inline_bytes:
        return {"output": output}, None
    await hold_publish_lock(conn)
    sha256, size = await run_sync(blobs.put_stream, io.BytesIO(data))
    return {"blob": sha256, "size": size}, sha256


async def load_output(blobs: BlobStore, result: Mapping[str, Any] | None) -> str:
    """The output a stored result holds (read from its blob when it has one)."""
    if result is None:
        return ""
    if "blob" not in result:
        return str(result.get("output") or "")
    sha256 = str(result["blob"])
    try:
        data = await run_sync(lambda: b"".join(blobs.iter_chunks(sha256)))
    except OSError as exc:
        raise BlobStoreError(f"the stored result in blob {sha256} cannot be read: {exc}") from exc
    return data.decode()
