"""An approval's state sealed at rest: its review snapshot, summary and run state (design
invariant 6, docs/security.md).

The gate seals them for the approval (`cairn.durable.sealing`: a fresh data key, associated
data binding tenant, kind `approval` and the approval's id) in the transaction that stores
the row, which keeps only the sealed bytes. Whoever shows or continues the approval opens
them: the gate (a pending call's request, an approved call's checks) and the API. A state
that does not open (altered, truncated, swapped with another approval's or another tenant's,
its data key gone, another master key) is a `StateDeserializeError`: the gate never
continues on it, and the API shows the approval with `state: "unreadable"`.

Rows from before sealing (run state version 1) have their state in clear columns: shown as
they are, never continued (the gate's `migration_required`). Deleting a state (its time to
live, or its session deleted) clears the row's state and shreds its data keys in one
transaction; the approval stays as the record of what was decided.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from cairn.durable.crypto import SealScope
from cairn.durable.sealing import Sealer
from cairn.errors import StateDeserializeError
from cairn.store.approvals import ApprovalRecord, clear_states
from cairn.store.db import Connection

__all__ = ["APPROVAL_KIND", "StateView", "approval_scope", "delete_states", "open_state", "seal_state", "state_view"]

# The kind of record an approval's sealed state belongs to.
APPROVAL_KIND = "approval"

# What the API says of an approval's stored state.
StateView = Literal["sealed", "clear", "deleted", "unreadable"]


def approval_scope(approval: ApprovalRecord) -> SealScope:
    return SealScope(tenant=approval.tenant, kind=APPROVAL_KIND, record_id=approval.id)


async def seal_state(sealer: Sealer, conn: Connection, approval: ApprovalRecord) -> ApprovalRecord:
    """`approval` as it is stored: review, summary and run state sealed, their data key
    stored in `conn`'s transaction, the clear fields empty."""
    content = {"review": approval.review, "summary": approval.summary, "run_state": approval.run_state}
    sealed = await sealer.seal_json(conn, content, approval_scope(approval))
    return dataclasses.replace(approval, review=None, summary=None, run_state=None, sealed_state=sealed)


async def open_state(sealer: Sealer, conn: Connection, approval: ApprovalRecord) -> ApprovalRecord:
    """`approval` with its review, summary and run state in clear; a version 1 row as it is.
    `StateDeserializeError` when the sealed state does not open as this approval's, or a
    sealed row has none (deleted, or cleared behind Cairn's back)."""
    if approval.sealed_state is None:
        if approval.run_state is not None:
            return approval  # a row from before sealing: the gate does not continue it
        deleted = approval.state_deleted_at is not None
        raise StateDeserializeError(
            f"the state of approval {approval.id} is {'deleted' if deleted else 'missing'}; the call cannot continue",
            context={"kind": APPROVAL_KIND, "record_id": approval.id},
        )
    if approval.run_state is not None or approval.review is not None or approval.summary is not None:
        raise StateDeserializeError(
            f"approval {approval.id} has its state both sealed and in clear: it was altered",
            context={"kind": APPROVAL_KIND, "record_id": approval.id},
        )
    content = await sealer.open_json(conn, approval.sealed_state, approval_scope(approval))
    if not isinstance(content, dict) or not isinstance(content.get("run_state"), dict):
        raise StateDeserializeError(f"the sealed state of approval {approval.id} is not an approval's state")
    summary: Any = content.get("summary")
    return dataclasses.replace(approval, review=content.get("review"), summary=str(summary), run_state=content["run_state"])


async def state_view(sealer: Sealer, conn: Connection, approval: ApprovalRecord) -> tuple[ApprovalRecord, StateView]:
    """`approval` opened for showing, and what its stored state is; never raises for a
    state that does not open (the approval is shown without it)."""
    if approval.state_deleted_at is not None:
        return approval, "deleted"
    try:
        opened = await open_state(sealer, conn, approval)
    except StateDeserializeError:
        return approval, "unreadable"
    return opened, "sealed" if approval.sealed_state is not None else "clear"


async def delete_states(sealer: Sealer, conn: Connection, approval_ids: Sequence[str]) -> int:
    """Delete the stored state of these approvals and shred its data keys, in `conn`'s
    transaction; returns how many still had one."""
    cleared = await clear_states(conn, approval_ids)
    await sealer.shred_records(conn, APPROVAL_KIND, *cleared)
    return len(cleared)
