"""The retention sweep: settled entries of turns long over are deleted.

A periodic task of every worker process (`cairn.worker.service`). An entry is needed while
its turn may still run the call; once the turn is over (or gone with its session) it is the
record of what happened, kept `Settings.ledger_retention_s` after it settled, then deleted
in batches, with the data keys of their sealed results (shredded in the same transaction).
`uncertain` entries stay until a person resolves them. A large result's blob is unreferenced
then, and the blob garbage collector frees it.
"""

from __future__ import annotations

import logging
import time

from cairn.engine.ledger.results import TOOL_RESULT_KIND
from cairn.engine.runtime import Runtime
from cairn.store.ledger import sweep_settled_entries

__all__ = ["sweep_ledger"]

log = logging.getLogger(__name__)

_BATCH = 500


async def sweep_ledger(rt: Runtime) -> int:
    """Delete every settled entry past its retention; returns how many were deleted."""
    settled_before = time.time() - rt.settings.ledger_retention_s
    deleted = 0
    while True:
        async with rt.db.write() as conn:
            swept = await sweep_settled_entries(conn, settled_before=settled_before, limit=_BATCH)
            await rt.sealer.shred_records(conn, TOOL_RESULT_KIND, *swept)
        deleted += len(swept)
        if len(swept) < _BATCH:
            break
    if deleted:
        log.info("ledger sweep: %d settled entries past their retention deleted", deleted)
    return deleted
