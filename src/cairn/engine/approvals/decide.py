"""Deciding an approval: one function for the three ways in (REST, the Agents API's input
event, the CLI through REST), so the same rules hold for all.

A decision runs in a journal transaction of the approval's session (its row locked, so it
is ordered against the turn's own writes, a cancel or a delete). It is checked before
anything is written, so a refused decision changes nothing:

- the approval exists in the caller's tenant (404 otherwise, like an unknown id);
- the deciding key's role is one the tool's `approvers` names (403); revoking is also open
  to the tenant's `admin`;
- approve, reject and dismiss need a `pending` approval whose time has not run out, and
  approve through REST or the CLI needs the digest the approver was shown (409 otherwise);
  revoke needs an approval that is pending, or approved and not started (409).

The write is a compare-and-set from the status read (design invariant 3): of two decisions
at once, the second gets 409. A decision that ends a hold releases it; the turn's job is
queued with nothing but ids, and any worker resumes it, where the gate checks the approval
again before the call runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum

from cairn.engine.journal import Journal, Transaction
from cairn.engine.loop.waiting import release_hold
from cairn.errors import ConflictError, NotFoundError, PermissionDeniedError
from cairn.states import ApprovalReason, ApprovalStatus
from cairn.store.approvals import ApprovalRecord, Decider, database_time, get_approval, transition_approval

__all__ = ["Decision", "DecisionRequest", "apply_decision", "decide"]

log = logging.getLogger(__name__)


class Decision(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"
    DISMISS = "dismiss"  # the Agents API's `cancel`: no decision, the call does not run
    REVOKE = "revoke"


@dataclass(frozen=True, slots=True)
class DecisionRequest:
    decision: Decision
    # The digest the approver was shown; required to approve through REST and the CLI.
    arguments_digest: str | None = None
    # The rejection message (reject) or the reason (revoke).
    message: str | None = None


def _not_found(approval_id: str) -> NotFoundError:
    return NotFoundError(f"No approval found with id '{approval_id}'.", param="approval_id")


async def decide(journal: Journal, decider: Decider, approval_id: str, request: DecisionRequest) -> ApprovalRecord:
    """Apply a decision on `approval_id` in its own transaction; returns the approval as decided."""
    async with journal.db.read() as conn:
        found = await get_approval(conn, approval_id, tenant=decider.tenant)
    if found is None:
        raise _not_found(approval_id)
    async with journal.transaction(found.session_id) as tx:
        return await apply_decision(tx, decider, approval_id, request)


async def apply_decision(
    tx: Transaction, decider: Decider, approval_id: str, request: DecisionRequest, *, session_id: str | None = None
) -> ApprovalRecord:
    """Apply a decision inside `tx`, which holds the lock of the approval's session; with
    `session_id`, an approval of another session is unknown."""
    approval = await get_approval(tx.conn, approval_id, tenant=decider.tenant)
    if approval is None or (session_id is not None and approval.session_id != session_id):
        raise _not_found(approval_id)
    _check_rights(decider, approval, request.decision)
    if request.decision == Decision.REVOKE:
        decided = await _revoke(tx, decider, approval, request.message)
    else:
        decided = await _answer(tx, decider, approval, request)
    log.info("approval %s %s by key %s (role %s)", decided.id, decided.status, decider.key_id, decider.role)
    return decided


def _check_rights(decider: Decider, approval: ApprovalRecord, decision: Decision) -> None:
    allowed = set(approval.approvers) | ({"admin"} if decision == Decision.REVOKE else set())
    if decider.role not in allowed:
        raise PermissionDeniedError(
            f"API key {decider.key_id} has role {decider.role!r}; approval {approval.id} may be decided by "
            f"{', '.join(sorted(allowed))}"
        )


async def _answer(tx: Transaction, decider: Decider, approval: ApprovalRecord, request: DecisionRequest) -> ApprovalRecord:
    if approval.status != ApprovalStatus.PENDING:
        raise ConflictError(f"approval {approval.id} is already {approval.status}", code="approval_decided")
    if await database_time(tx.conn) >= approval.expires_at:
        raise ConflictError(f"approval {approval.id} has expired", code="approval_expired")
    if request.decision == Decision.APPROVE:
        if request.arguments_digest is not None and request.arguments_digest != approval.arguments_digest:
            raise ConflictError(
                f"approval {approval.id} is for another call than the one reviewed: its arguments_digest differs",
                code="digest_mismatch",
                param="arguments_digest",
            )
        to, reason, message = ApprovalStatus.APPROVED, None, None
    elif request.decision == Decision.REJECT:
        to, reason, message = ApprovalStatus.REJECTED, None, request.message
    else:
        to, reason, message = ApprovalStatus.REJECTED, ApprovalReason.DISMISSED, None
    decided = await transition_approval(
        tx.conn, approval, to, reason=reason, message=message, decider=decider, unexpired=True
    )
    await release_hold(tx, decided.turn_id, decided.call_id, resume_now=True)
    return decided


async def _revoke(tx: Transaction, decider: Decider, approval: ApprovalRecord, reason: str | None) -> ApprovalRecord:
    if approval.status not in (ApprovalStatus.PENDING, ApprovalStatus.APPROVED):
        raise ConflictError(f"approval {approval.id} is already {approval.status}", code="approval_decided")
    if approval.is_started:
        raise ConflictError(f"the call approved by {approval.id} has already started", code="approval_started")
    # Revoking an approved call keeps who approved it on record (the audit log names who revoked).
    revoker = decider if approval.status == ApprovalStatus.PENDING else None
    revoked = await transition_approval(
        tx.conn, approval, ApprovalStatus.REVOKED, reason=ApprovalReason.REVOKED, message=reason, decider=revoker,
        unstarted=True,
    )
    # A pending approval held the call; an approved one released it already, and the gate
    # finds it revoked when the worker gets to it.
    await release_hold(tx, revoked.turn_id, revoked.call_id, resume_now=True)
    return revoked
