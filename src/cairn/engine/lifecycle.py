"""Turn and session transitions shared by the worker and the API.

Closing a turn (completed, failed, cancelled), closing its open approvals and the ledger
entries its calls left unsettled, and moving the session on (to the next queued turn, or to
idle) happen in one journal transaction, so the
log never shows a turn ending without the session's next state. These functions only write inside the
caller's transaction, and move statuses only through the store's guarded transitions
(`cairn.states`): a move made on a stale read fails instead of overwriting a newer state.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cairn.engine.events import item_event, session_event, turn_event
from cairn.engine.journal import Transaction
from cairn.engine.wire import render_usage
from cairn.errors import AgentVersionError
from cairn.states import ApprovalReason, ApprovalStatus, ItemStatus, SessionStatus, TurnStatus
from cairn.store.approvals import close_approvals
from cairn.store.items import ItemRecord, new_item, turn_items
from cairn.store.jobs import enqueue_job
from cairn.store.ledger import close_turn_entries
from cairn.store.required_actions import drop_required_actions
from cairn.store.sessions import SessionRecord, get_session, transition_session, update_session
from cairn.store.turns import TurnRecord, next_queued_turn, transition_turn

__all__ = [
    "REMOVE_WORKSPACE",
    "RUN_TURN",
    "add_call_output",
    "advance_session",
    "close_open_item",
    "close_turn",
    "interrupt_open_items",
    "queue_turn_job",
    "queue_workspace_removal",
    "set_session_status",
]

log = logging.getLogger(__name__)

RUN_TURN = "run_turn"
# Remove a deleted session's workspace and snapshots, on a worker (payload: the tenant).
REMOVE_WORKSPACE = "remove_workspace"


async def queue_workspace_removal(tx: Transaction, tenant: str, session_id: str) -> None:
    """Queue the removal of a deleted session's workspace and snapshots, in its delete's transaction."""
    if await enqueue_job(tx.conn, kind=REMOVE_WORKSPACE, session_id=session_id, turn_id=None, payload={"tenant": tenant}):
        tx.jobs_queued = True


async def queue_turn_job(tx: Transaction, turn: TurnRecord) -> None:
    if await enqueue_job(tx.conn, kind=RUN_TURN, session_id=turn.session_id, turn_id=turn.id):
        tx.jobs_queued = True


async def set_session_status(tx: Transaction, session_id: str, status: SessionStatus) -> SessionRecord:
    """Move the session to `status` and emit the matching event."""
    before = await get_session(tx.conn, session_id)
    assert before is not None
    session = await transition_session(tx.conn, before, status, last_active_at=time.time())
    tx.emit(session_event(status, session))
    return session


async def advance_session(tx: Transaction, session_id: str) -> None:
    """After a turn ends: start the next queued turn, or make the session idle."""
    queued = await next_queued_turn(tx.conn, session_id)
    if queued is not None:
        await queue_turn_job(tx, queued)
        return
    await set_session_status(tx, session_id, SessionStatus.IDLE)


async def add_call_output(tx: Transaction, call: ItemRecord, *, output: Any, error: str | None) -> ItemRecord:
    """Record the result of a function call (by Cairn or the client) and announce it."""
    data: dict[str, Any] = {"call_id": call.call_id}
    if error is None:
        data["output"] = output
    else:
        data["error"] = error
    item = await tx.insert_item(
        new_item(
            session_id=call.session_id,
            turn_id=call.turn_id,
            type="function_call_output",
            status=ItemStatus.COMPLETED if error is None else ItemStatus.FAILED,
            call_id=call.call_id,
            tool_kind=call.tool_kind,
            data=data,
        )
    )
    tx.emit(item_event("added", item, None))
    return item


async def close_open_item(tx: Transaction, item: ItemRecord, note: str) -> ItemRecord:
    """Mark one in-progress item `incomplete`, saying why in a command's output or an
    `mcp_call`'s error."""
    data = dict(item.data)
    if item.type == "command_execution":
        data["output"] = (data.get("output") or "") + f"\n[{note}]"
    elif item.type == "mcp_call":
        data["error"] = note
    closed = await tx.transition_item(item, ItemStatus.INCOMPLETE, data=data)
    tx.emit(item_event("done", closed, closed.output_index))
    return closed


async def interrupt_open_items(tx: Transaction, turn: TurnRecord, note: str) -> None:
    """Close every item of the turn that is still in progress."""
    for item in await turn_items(tx.conn, turn.id):
        if item.status == ItemStatus.IN_PROGRESS:
            await close_open_item(tx, item, note)


async def _close_turn_approvals(tx: Transaction, turn: TurnRecord, status: TurnStatus, error: dict[str, str] | None) -> None:
    """The turn's calls will never run: what was held for a decision, or approved and not yet
    started, is closed with it. A turn that fails because its pinned agent version is gone or
    changed invalidates them as needing migration (docs/approvals.md)."""
    if status == TurnStatus.CANCELLED:
        await close_approvals(tx.conn, ApprovalReason.SESSION_CANCELLED, turn_id=turn.id)
    elif error is not None and error.get("code") == AgentVersionError.default_code:
        await close_approvals(tx.conn, ApprovalReason.MIGRATION_REQUIRED, to=ApprovalStatus.INVALIDATED, turn_id=turn.id)
    else:
        await close_approvals(tx.conn, ApprovalReason.TURN_FAILED, turn_id=turn.id)


async def close_turn(
    tx: Transaction, turn: TurnRecord, status: TurnStatus, *, error: dict[str, str] | None = None
) -> TurnRecord:
    """End `turn` with `status`, close its open items, and move the session on; raises
    `StatusConflictError` if another writer moved the turn since it was read."""
    if status != TurnStatus.COMPLETED:
        await interrupt_open_items(tx, turn, f"turn {status}")
        await _close_turn_approvals(tx, turn, status, error)
    # Its calls never run again: a reservation (one refused, say) or a retry never happens,
    # and a tool cut short has an unknown outcome (uncertain, for a person to resolve).
    uncertain = await close_turn_entries(tx.conn, turn.id)
    if uncertain:
        log.warning("turn %s %s while %d side effect(s) ran: their ledger entries are uncertain", turn.id, status, uncertain)
    if error is not None:
        error = tx.redactor.value(error)  # a failure's message may quote a tool's secret
    closed = await transition_turn(tx.conn, turn, status, error=error, completed_at=time.time(), lease_token=None)
    if turn.status == TurnStatus.WAITING:
        await drop_required_actions(tx.conn, turn.id)
    tx.emit(turn_event(status, closed, usage=render_usage(closed.usage)))
    if closed.usage:
        session = await get_session(tx.conn, turn.session_id)
        assert session is not None
        total = {k: int((session.usage or {}).get(k, 0)) + int(v) for k, v in closed.usage.items()}
        await update_session(tx.conn, turn.session_id, usage=total)
    await advance_session(tx, turn.session_id)
    return closed
