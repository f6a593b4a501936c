"""A turn that waits for its held calls, and its resumption when they are released.

A turn waits when calls of its step are held: by the gate (an approval, say) or handed to
the client. The turn goes `waiting` without a lease, the session `requires_action` with a
required action per hold, and the job ends, so no worker holds anything while a person or
the client takes their time. When the last hold ends, the turn goes back to `in_progress`
and its job is queued again; any worker continues it from the database, and the held calls
go through the pipeline again (`cairn.engine.loop.step`).
"""

from __future__ import annotations

from collections.abc import Sequence

from cairn.engine.journal import Transaction
from cairn.engine.lifecycle import queue_turn_job, set_session_status
from cairn.engine.tools.base import Hold
from cairn.states import ApprovalStatus, SessionStatus, TurnStatus
from cairn.store.approvals import get_approval
from cairn.store.items import pending_client_calls
from cairn.store.jobs import Job, complete_job
from cairn.store.required_actions import RequiredAction, add_required_actions, drop_required_actions, resolve_required_action
from cairn.store.sessions import get_session
from cairn.store.turns import TurnRecord, get_turn, transition_turn

__all__ = ["release_hold", "wait_for_holds"]


async def wait_for_holds(tx: Transaction, job: Job, turn: TurnRecord, holds: Sequence[Hold]) -> bool:
    """Make the turn wait for `holds`, ending `job`; False, writing nothing, when none is left
    to wait for (the client answered its calls while the others ran)."""
    unanswered = {c.call_id for c in await pending_client_calls(tx.conn, turn.id)}
    actions = [
        RequiredAction(turn.session_id, turn.id, h.call_id, h.action_kind, dict(h.action))
        for h in holds
        if not h.awaits_client or h.call_id in unanswered
    ]
    if not actions:
        return False
    waiting = await transition_turn(tx.conn, turn, TurnStatus.WAITING, lease_token=None)
    # What the turn asked before it last resumed (a hold the client's results did not end)
    # is asked again below, as it stands now.
    await drop_required_actions(tx.conn, turn.id)
    await add_required_actions(tx.conn, actions)
    await set_session_status(tx, turn.session_id, SessionStatus.REQUIRES_ACTION)
    await complete_job(tx.conn, job)
    # An approval decided while the step's other calls ran found the turn still running, so
    # it could not release its hold: release it now, and the turn goes on at once.
    for action in actions:
        if await _is_decided_approval(tx, action):
            await release_hold(tx, waiting.id, action.call_id, resume_now=True)
            break
    return True


async def _is_decided_approval(tx: Transaction, action: RequiredAction) -> bool:
    request_id = action.payload.get("request_id")
    if action.kind != "mcp_approval_request" or not isinstance(request_id, str):
        return False
    approval = await get_approval(tx.conn, request_id)
    return approval is not None and approval.status != ApprovalStatus.PENDING


async def release_hold(tx: Transaction, turn_id: str, call_id: str, *, resume_now: bool = False) -> None:
    """The held call `call_id` of `turn_id` may go on: its required action is resolved, and the
    turn resumes if it waits for nothing else, or at once with `resume_now` (a decided
    approval: the worker runs the calls that may run and waits again for the others). A
    turn that is not waiting (cancelled, or resumed by the client's results) is left as it
    is; a worker running it asks the gate again anyway."""
    turn = await get_turn(tx.conn, turn_id)
    if turn is None or turn.status != TurnStatus.WAITING:
        return
    await resolve_required_action(tx.conn, turn.id, call_id)
    session = await get_session(tx.conn, turn.session_id)
    assert session is not None
    if not resume_now and any(a.turn_id == turn.id for a in session.required_actions):
        return
    await set_session_status(tx, session.id, SessionStatus.IN_PROGRESS)
    await queue_turn_job(tx, await transition_turn(tx.conn, turn, TurnStatus.IN_PROGRESS))
