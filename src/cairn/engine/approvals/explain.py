"""What the model is told when a call held for approval ends without running."""

from __future__ import annotations

from cairn.states import ApprovalReason, ApprovalStatus
from cairn.store.approvals import ApprovalRecord

__all__ = ["explain"]

_WHY: dict[str, str] = {
    ApprovalReason.EXPIRED: "no decision was made before the approval expired",
    ApprovalReason.DISMISSED: "the approval request was dismissed without a decision",
    ApprovalReason.DIGEST_MISMATCH: "the call no longer matches the call that was approved",
    ApprovalReason.RUN_STATE_MISMATCH: "the approval's record no longer names this call",
    ApprovalReason.MIGRATION_REQUIRED: "the agent version it was approved under is no longer loaded, or has changed",
    ApprovalReason.APPROVER_LOST_RIGHTS: "the approver's key was revoked or no longer has a role allowed to approve it",
    ApprovalReason.TENANT_MISMATCH: "the approval belongs to another session",
    ApprovalReason.SESSION_CANCELLED: "the turn was cancelled",
    ApprovalReason.TURN_FAILED: "the turn failed",
    ApprovalReason.SESSION_DELETED: "the session was deleted",
    ApprovalReason.STATE_DESERIALIZE_FAILURE: "its stored state does not decrypt or verify (altered, moved, or another master key)",
}


def explain(approval: ApprovalRecord) -> str:
    """One sentence for the model: the call did not run, and why."""
    if approval.status == ApprovalStatus.REJECTED and approval.reason is None:
        said = f": {approval.message}" if approval.message else ""
        return f"the call was rejected by the approver{said} (the tool did not run)"
    why = _WHY.get(approval.reason, approval.reason) if approval.reason else str(approval.status)
    if approval.status == ApprovalStatus.REVOKED and approval.reason == ApprovalReason.REVOKED:
        why = f"the approval was revoked{': ' + approval.message if approval.message else ''}"
    return f"the call did not run: {why} (approval {approval.id}, {approval.status})"
