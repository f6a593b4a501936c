"""Approvals whose time ran out become `expired` without anyone acting, and their turn goes on.

A periodic task of every worker process (`cairn.worker.service`): each pending approval
past its expiry (database clock) is moved to `expired` by a compare-and-set, in a journal
transaction of its session, and its hold is released, so any worker resumes the turn and
the gate finishes the call with the expiry as its result. A decision racing the expiry
loses or wins by the same compare-and-set; the tool never runs on an expired approval.
"""

from __future__ import annotations

import logging

from cairn.engine.journal import Journal
from cairn.engine.loop.waiting import release_hold
from cairn.errors import StatusConflictError
from cairn.states import ApprovalReason, ApprovalStatus
from cairn.store.approvals import database_time, due_for_expiry, get_approval, transition_approval

__all__ = ["expire_approvals"]

log = logging.getLogger(__name__)

_BATCH = 100


async def expire_approvals(journal: Journal) -> int:
    """Expire every pending approval whose time ran out; returns how many were expired."""
    expired = 0
    while True:
        async with journal.db.read() as conn:
            due = await due_for_expiry(conn, limit=_BATCH)
        for candidate in due:
            async with journal.transaction(candidate.session_id) as tx:
                approval = await get_approval(tx.conn, candidate.id)
                if approval is None or approval.status != ApprovalStatus.PENDING:
                    continue  # decided meanwhile
                if await database_time(tx.conn) < approval.expires_at:
                    continue
                try:
                    ended = await transition_approval(tx.conn, approval, ApprovalStatus.EXPIRED, reason=ApprovalReason.EXPIRED)
                except StatusConflictError:
                    continue  # a decision won the race: nothing to expire
                await release_hold(tx, ended.turn_id, ended.call_id, resume_now=True)
            expired += 1
            log.info("approval %s expired: %s call %s of session %s will not run", ended.id, ended.tool_name,
                     ended.call_id, ended.session_id)
        if len(due) < _BATCH:
            return expired
