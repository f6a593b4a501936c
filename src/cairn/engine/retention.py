"""How long what is sealed at rest is kept, and its deletion (docs/security.md, "Lifetimes").

- An approval's sealed state (review, summary, run state) lives by its status: a pending one
  at most `run_state_ttl_pending_s` (the gate caps its expiry to that), then as long as the
  status it ended in allows (`Settings.run_state_ttls`). Past that, `sweep_sealed_state`
  clears it and shreds its data key; the approval stays as the record of the decision.
- Deleting a session deletes its approvals' states, its ledger results and its turns' persisted
  contexts with their data keys (`delete_session_state`, in the deletion's transaction); the
  result blobs are then unreferenced and the blob garbage collector frees them. Deleting a credential or a vault
  shreds its secrets' keys (`cairn.engine.vaults`); the ledger's retention sweep shreds the
  keys of the entries it deletes.
- Every deletion shreds in its own transaction, so nothing is left half done by a crash
  there; `sweep_sealed_state` also deletes any data key whose record is gone or no longer
  keeps a sealed blob (left by a restore, a hand-made deletion, or a crash of anything that
  deletes records in more than one transaction): a key that opens nothing is only a risk.

The sweep is a periodic task of every worker process (`cairn.worker.service`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import sqlalchemy as sa

from cairn.durable.sealing import Sealer
from cairn.engine.approvals.sealed import APPROVAL_KIND, delete_states
from cairn.engine.ledger.results import TOOL_RESULT_KIND
from cairn.engine.loop.run_context import CONTEXT_KIND
from cairn.engine.runtime import Runtime
from cairn.engine.vaults.service import CREDENTIAL_KIND
from cairn.store.approvals import session_approval_ids, states_past_ttl
from cairn.store.data_keys import delete_data_keys, delete_session_turn_keys, orphaned_keys
from cairn.store.db import Connection
from cairn.store.ledger import forget_session_results
from cairn.store.tables import approvals, credentials, ledger_entries, turns

__all__ = ["SweepReport", "delete_session_state", "sweep_sealed_state"]

log = logging.getLogger(__name__)

_BATCH = 200

# Each kind of sealed record: its table, its id column, and whether a row still keeps a blob.
_OWNERS: tuple[tuple[str, sa.Table, str, sa.ColumnElement[bool] | None], ...] = (
    (APPROVAL_KIND, approvals, "id", approvals.c.state_deleted_at.is_(None)),
    (TOOL_RESULT_KIND, ledger_entries, "operation_key", ledger_entries.c.result.is_not(None)),
    (CREDENTIAL_KIND, credentials, "id", None),
    (CONTEXT_KIND, turns, "id", turns.c.context.is_not(None)),
)


async def delete_session_state(sealer: Sealer, conn: Connection, session_id: str) -> None:
    """In the transaction that deletes the session (before its turns go): its approvals'
    states, its ledger results and its turns' contexts go, with their data keys."""
    await delete_states(sealer, conn, await session_approval_ids(conn, session_id))
    await sealer.shred_records(conn, TOOL_RESULT_KIND, *await forget_session_results(conn, session_id))
    await delete_session_turn_keys(conn, CONTEXT_KIND, session_id)


@dataclass(slots=True)
class SweepReport:
    states_deleted: int = 0
    orphaned_keys_deleted: int = 0


async def sweep_sealed_state(rt: Runtime) -> SweepReport:
    """Delete the approval states past their time to live, and every orphaned data key."""
    report = SweepReport()
    ttls = rt.settings.run_state_ttls()
    while True:
        async with rt.db.write() as conn:
            due = await states_past_ttl(conn, ttls, limit=_BATCH)
            report.states_deleted += await delete_states(rt.sealer, conn, due)
        if len(due) < _BATCH:
            break
    for kind, table, id_column, keeps in _OWNERS:
        while True:
            async with rt.db.write() as conn:
                orphans = await orphaned_keys(conn, kind, table, id_column=id_column, keeps=keeps, limit=_BATCH)
                report.orphaned_keys_deleted += await delete_data_keys(conn, orphans)
            if len(orphans) < _BATCH:
                break
    if report.states_deleted or report.orphaned_keys_deleted:
        log.info("sealed state sweep: %d approval states past their time to live and %d orphaned data keys deleted",
                 report.states_deleted, report.orphaned_keys_deleted)
    return report
