"""An approval as the API shows it: what was asked, what was decided, and by whom.

Never the run state: it is the engine's, and nothing a client decides on.
"""

from __future__ import annotations

from typing import Any

from cairn.store.approvals import ApprovalRecord

__all__ = ["render_approval"]


def _seconds(value: float | None) -> int | None:
    return int(value) if value is not None else None


def render_approval(approval: ApprovalRecord) -> dict[str, Any]:
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
