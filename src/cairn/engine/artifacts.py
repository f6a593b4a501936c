"""Publishing `/workspace/outputs`: files new or changed in a completed turn become
immutable artifacts bound to `(turn_id, path)`.

The session keeps a manifest of what it last published (path → digest, size, mtime), so
an unchanged file is neither re-read nor re-published. Content goes to the
content-addressed blob store before the artifact rows are written, and the rows are
written under the sweep lock after checking that the content is still there, so a row
never points at missing bytes even while blob garbage collection runs
(`cairn.engine.blob_gc`). Symlinks are never followed: a planted link cannot publish
host files.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cairn._concurrency import run_sync
from cairn.blobs import BlobStore
from cairn.engine.workspace_files import WorkspaceFiles
from cairn.errors import BlobStoreError
from cairn.ids import new_artifact_id
from cairn.sandbox.base import WORKSPACE_MOUNT
from cairn.store.artifacts import ArtifactRecord, insert_artifact
from cairn.store.blob_locks import hold_publish_lock
from cairn.store.db import Connection
from cairn.store.sessions import SessionRecord, update_session

__all__ = ["OUTPUTS_DIR", "PublishedOutput", "collect_outputs", "record_outputs"]

OUTPUTS_DIR = "outputs"


@dataclass(frozen=True, slots=True)
class PublishedOutput:
    path: str  # absolute, as the agent sees it
    sha256: str
    size: int
    mtime_ns: int
    blob_path: Path  # where the content was stored; checked again when the row is written


def _collect(files: WorkspaceFiles, blobs: BlobStore, manifest: dict[str, Any]) -> list[PublishedOutput]:
    changed = []
    for info in files.regular_files(OUTPUTS_DIR):
        path = f"{WORKSPACE_MOUNT}/{info.path}"
        fd = files.open_regular(info.path)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            known = manifest.get(path)
            if known is not None and known.get("size") == st.st_size and known.get("mtime_ns") == st.st_mtime_ns:
                continue
            sha256, size = blobs.put_stream(f)
        if known is not None and known.get("sha256") == sha256:
            continue
        changed.append(
            PublishedOutput(path=path, sha256=sha256, size=size, mtime_ns=st.st_mtime_ns, blob_path=blobs.path_of(sha256))
        )
    return changed


async def collect_outputs(files: WorkspaceFiles, blobs: BlobStore, session: SessionRecord) -> list[PublishedOutput]:
    """Store the content of new or changed outputs; rows are written by `record_outputs`."""
    return await run_sync(_collect, files, blobs, session.outputs_manifest)


def _missing(outputs: list[PublishedOutput]) -> list[PublishedOutput]:
    return [output for output in outputs if not output.blob_path.is_file()]


async def record_outputs(
    conn: Connection, session: SessionRecord, turn_id: str, outputs: list[PublishedOutput]
) -> list[ArtifactRecord]:
    if not outputs:
        return []
    # Held to the end of the caller's transaction: content found here cannot be collected
    # before the rows that reference it are committed, and then they keep it.
    await hold_publish_lock(conn)
    missing = await run_sync(_missing, outputs)
    if missing:
        raise BlobStoreError(
            f"the stored content of {missing[0].path} was deleted before the turn recorded it: blob garbage "
            "collection deletes unreferenced content stored more than CAIRN_BLOB_GC_GRACE_S ago, and "
            "publishing this turn's outputs took longer",
            context={"sha256": missing[0].sha256},
        )
    now = time.time()
    manifest = dict(session.outputs_manifest)
    records = []
    for output in outputs:
        record = ArtifactRecord(
            id=new_artifact_id(),
            session_id=session.id,
            tenant=session.tenant,
            turn_id=turn_id,
            environment_id=session.environment_id,
            path=output.path,
            size_bytes=output.size,
            sha256=output.sha256,
            created_at=now,
        )
        await insert_artifact(conn, record)
        records.append(record)
        manifest[output.path] = {"sha256": output.sha256, "size": output.size, "mtime_ns": output.mtime_ns}
    await update_session(conn, session.id, outputs_manifest=manifest)
    return records
