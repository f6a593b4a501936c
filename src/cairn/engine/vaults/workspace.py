"""A secret value that sandboxed code wrote into its workspace is replaced there by the marker.

Sandboxed code never receives a credential's value (it gets a placeholder), but it can come
by one anyway: a server that echoes the request the egress proxy completed, pieces of a
value the model was shown, a file an operator tool wrote. The workspace is the agent's
content, and it is also what Cairn stores: outputs are published as artifacts and the whole
workspace is persisted as snapshots. So before either happens, at the end of every
execution of a turn of a session that has secrets (it completes, pauses, is handed back or
fails), the files the execution changed are searched for the session's known values, and
each one found is replaced in place by `[redacted]`, like anything else Cairn stores.

Like all redaction this is a net for accidents, not a wall: a file larger than
`MAX_SCANNED_BYTES`, a value written encrypted or reversed, or a file whose modification time
was set back is not caught (docs/security.md).
"""

from __future__ import annotations

import logging

from cairn._concurrency import run_sync
from cairn.engine.workspace_files import WorkspaceFiles
from cairn.errors import InvalidRequestError
from cairn.redaction import Redactor
from cairn.sandbox.base import WORKSPACE_MOUNT

__all__ = ["MAX_SCANNED_BYTES", "redact_workspace"]

log = logging.getLogger(__name__)

MAX_SCANNED_BYTES = 16 * 1024 * 1024
# Modification times are the file system's clock, which may lag the process's a little.
_CLOCK_SLACK_NS = 2_000_000_000


def _redact_files(files: WorkspaceFiles, redactor: Redactor, since_ns: int) -> list[str]:
    redacted: list[str] = []
    if not files.root.is_dir():
        return redacted
    for info in files.regular_files(WORKSPACE_MOUNT):
        if info.mtime_ns < since_ns - _CLOCK_SLACK_NS:
            continue
        if info.size > MAX_SCANNED_BYTES:
            log.warning("workspace file /workspace/%s (%d bytes) is too large to be searched for secret values", info.path, info.size)
            continue
        try:
            data = files.read_bytes(info.path, max_bytes=MAX_SCANNED_BYTES)
        except InvalidRequestError:
            continue  # gone or replaced since it was listed
        # Bytes that are not UTF-8 go through unchanged (surrogate escapes round-trip them).
        text = data.decode("utf-8", errors="surrogateescape")
        clean = redactor.text(text)
        if clean != text:
            files.write_bytes(info.path, clean.encode("utf-8", errors="surrogateescape"))
            redacted.append(info.path)
    return redacted


async def redact_workspace(files: WorkspaceFiles, redactor: Redactor, *, since_ns: int) -> list[str]:
    """Replace every known secret value in the workspace's files changed since `since_ns`;
    returns the paths (relative to /workspace) that changed."""
    if redactor.is_empty:
        return []
    return await run_sync(_redact_files, files, redactor, since_ns)
