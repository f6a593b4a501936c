"""An approval as the API shows it: what was asked, what was decided, and by whom.

Never the run state: it is the engine's, and nothing a client decides on. The review and
summary are opened from the sealed state for showing; `state` says what is stored of it:
`sealed`, `clear` (a row from before sealing), `deleted` (past its time to live, or its
session deleted: review and summary are null), or `unreadable` (it does not decrypt or
verify: null too, and the gate never continues it).
"""

from __future__ import annotations

from typing import Any

from cairn.durable.sealing import Sealer
from cairn.engine.approvals.sealed import StateView, state_view
from cairn.store.approvals import ApprovalRecord
from cairn.store.db import Connection

__all__ = ["render_approval", "show_approval"]


def _seconds(value: float | None) -> int | None:
    return int(value) if value is not None else None


async def show_approval(sealer: Sealer, conn: Connection, approval: ApprovalRecord) -> dict[str, Any]:
    """`approval` as the API shows it, its state opened in `conn`."""
    opened, state = await state_view(sealer, conn, approval)
    return render_approval(opened, state)


def render_approval(approval: ApprovalRecord, state: StateView) -> dict[str, Any]:
    """`approval` (its state opened, or not readable as `state` says) as the API shows it."""
    decided_by = None
    if approval.decided_by is not None:
        decided_by = {"key_id": approval.decided_by, "tenant": approval.decided_tenant, "role": approval.decided_role}
    return {
        "id": approval.id,
        "object": "approval",
        "status": approval.status,
        "reason": approval.reason,
        "message": approval.message,
        "session_id": approval.session_id,
        "turn_id": approval.turn_id,
        "call_id": approval.call_id,
        "tool_name": approval.tool_name,
        "review": approval.review,
        "summary": approval.summary,
        "state": state,
        "arguments_digest": approval.arguments_digest,
        "agent_version": approval.agent_version,
        "agent_revision": approval.agent_revision,
        "approvers": approval.approvers,
        "created_at": _seconds(approval.created_at),
        "expires_at": _seconds(approval.expires_at),
        "decided_at": _seconds(approval.decided_at),
        "started_at": _seconds(approval.started_at),
        "decided_by": decided_by,
    }
