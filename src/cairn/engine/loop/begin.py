"""Taking up a claimed job's turn: is it still to run, its model and workspace, and the
turn started (or taken over from the worker that had it).

A job whose turn is gone, over, or cancelled before it started is settled here and runs
nothing. A turn that cannot start (its pinned agent version is not loaded here unchanged,
an unknown model, credentials or a stored context that cannot be decrypted, a workspace that
cannot be prepared) fails before its first step. The session's credentials are decrypted
here, in memory, at every execution: the first run and each resume
(`cairn.engine.vaults.injection`), and so is the run's persisted context
(`cairn.engine.loop.run_context`). The workspace is ready before the turn starts, so its events
precede the turn's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cairn.engine.events import environment_event, item_event, turn_event
from cairn.engine.journal import Transaction
from cairn.engine.lifecycle import close_turn, set_session_status
from cairn.engine.loop.run_context import TurnContext, open_turn_context
from cairn.engine.runtime import Runtime
from cairn.engine.vaults.injection import SessionSecrets, load_session_secrets
from cairn.errors import AgentVersionError, CairnError, StatusConflictError
from cairn.models.base import Model
from cairn.snapshots import StartOutcome
from cairn.states import EnvironmentStatus, SessionStatus, TurnStatus
from cairn.store.items import ItemRecord, new_item, session_items
from cairn.store.jobs import Job, complete_job
from cairn.store.sessions import SessionRecord, get_session, set_environment_status
from cairn.store.turns import TurnRecord, get_turn, transition_turn

__all__ = ["TurnStart", "begin_turn"]


@dataclass(frozen=True, slots=True)
class TurnStart:
    """A turn this worker now runs, as the database had it."""

    job: Job
    session: SessionRecord
    turn: TurnRecord
    model: Model
    items: list[ItemRecord]  # the session's history
    # The session's credentials for this execution, in memory only.
    secrets: SessionSecrets
    # The run's persisted context, as the turn's last execution stored it.
    context: TurnContext
    # When this execution began (ns since the epoch): what it changed in the workspace is newer.
    began_ns: int
    # A worker died (or lost its lease) running this turn: what it left open needs recovery.
    is_taken_over: bool


async def begin_turn(rt: Runtime, job: Job) -> TurnStart | None:
    """Start or take over the job's turn; None when there is nothing to run (the job is done)."""
    assert job.turn_id is not None
    began_ns = time.time_ns()
    async with rt.db.read() as conn:
        turn = await get_turn(conn, job.turn_id)
        session = await get_session(conn, job.session_id)
    if not _is_runnable(turn, session):
        await _settle_unrunnable(rt, job)
        return None
    assert turn is not None and session is not None
    if session.agent_version is not None:
        try:
            rt.agents.pinned(session.agent_version, session.agent_revision)
        except AgentVersionError as exc:
            await _fail_before_start(rt, job, turn, {"code": exc.code, "message": exc.message})
            return None
    try:
        model = rt.resolve_model(session.agent["model"])
    except CairnError as exc:
        await _fail_before_start(rt, job, turn, {"code": "invalid_request", "message": exc.message})
        return None
    try:
        secrets = await load_session_secrets(rt, session)
        async with rt.db.read() as conn:
            context = await open_turn_context(conn, rt.sealer, rt.agents, session, turn)
    except CairnError as exc:
        await model.aclose()
        await _fail_before_start(rt, job, turn, {"code": exc.code, "message": exc.message})
        return None
    try:
        started = await _take_up(rt, job, session, turn, model, (secrets, context), began_ns)
    except BaseException:
        await model.aclose()
        raise
    if started is None:
        await model.aclose()
    return started


async def _take_up(
    rt: Runtime,
    job: Job,
    session: SessionRecord,
    turn: TurnRecord,
    model: Model,
    opened: tuple[SessionSecrets, TurnContext],
    began_ns: int,
) -> TurnStart | None:
    if session.environment["type"] != "none":
        failure = await _acquire_workspace(rt, session, turn)
        if failure is not None:
            await _fail_before_start(rt, job, turn, failure)
            return None
    assert job.turn_id is not None
    try:
        async with rt.journal.transaction(job.session_id) as tx:
            current = await get_turn(tx.conn, job.turn_id)
            current_session = await get_session(tx.conn, job.session_id)
            if not _is_runnable(current, current_session):
                started = None
            else:
                assert current is not None and current_session is not None
                # A turn resumed after it waited has no lease: its last worker ended the job.
                is_taken_over = current.status != TurnStatus.QUEUED and current.lease_token is not None
                if current.status == TurnStatus.QUEUED:
                    current = await _start(tx, current, current_session, job)
                else:
                    current = await transition_turn(tx.conn, current, TurnStatus.IN_PROGRESS, lease_token=job.lease_token)
                current_session = await get_session(tx.conn, job.session_id)
                assert current_session is not None
                items = await session_items(tx.conn, current_session.id)
                started = TurnStart(job, current_session, current, model, items, *opened, began_ns, is_taken_over)
    except StatusConflictError:
        started = None  # the turn moved (was cancelled) between its read and this write
    if started is None:
        await _settle_unrunnable(rt, job)
    return started


def _is_runnable(turn: TurnRecord | None, session: SessionRecord | None) -> bool:
    """The turn exists, is queued or running, and nobody asked to cancel it."""
    return (
        turn is not None
        and session is not None
        and turn.status in (TurnStatus.QUEUED, TurnStatus.IN_PROGRESS)
        and not turn.cancel_requested
    )


async def _settle_unrunnable(rt: Runtime, job: Job) -> None:
    """Finish a job whose turn is gone, over, or cancelled before it started."""
    assert job.turn_id is not None
    async with rt.journal.transaction(job.session_id) as tx:
        turn = await get_turn(tx.conn, job.turn_id)
        if turn is not None and turn.status in (TurnStatus.QUEUED, TurnStatus.IN_PROGRESS) and turn.cancel_requested:
            await close_turn(tx, turn, TurnStatus.CANCELLED)
        await complete_job(tx.conn, job)


async def _fail_before_start(rt: Runtime, job: Job, turn: TurnRecord, error: dict[str, str]) -> None:
    try:
        async with rt.journal.transaction(job.session_id) as tx:
            await close_turn(tx, turn, TurnStatus.FAILED, error=error)
            await complete_job(tx.conn, job)
    except StatusConflictError:
        await _settle_unrunnable(rt, job)  # closed (cancelled) while its workspace was prepared


async def _acquire_workspace(rt: Runtime, session: SessionRecord, turn: TurnRecord) -> dict[str, str] | None:
    """Reuse, restore or create the workspace, with its events; the turn's error on failure."""
    try:
        started = await rt.environments.acquire(session.tenant, session.id, session.environment)
    except CairnError as exc:
        async with rt.journal.transaction(session.id) as tx:
            tx.emit(environment_event("failed", session, status="failed", turn_id=turn.id))
        return {"code": "sandbox_error", "message": f"the workspace could not be prepared: {exc.message}"}
    was_suspended = session.environment_status == EnvironmentStatus.SUSPENDED
    if started is not None and (started.outcome is StartOutcome.RESTORED or was_suspended):
        async with rt.journal.transaction(session.id) as tx:
            current = await set_environment_status(tx.conn, session.id, EnvironmentStatus.READY)
            assert current is not None
            if started.outcome is StartOutcome.RESTORED:
                tx.emit(environment_event("pending", current, status="pending", turn_id=turn.id))
            tx.emit(environment_event("ready", current, status="ready", turn_id=turn.id))
    return None


async def _start(tx: Transaction, turn: TurnRecord, session: SessionRecord, job: Job) -> TurnRecord:
    if session.status != SessionStatus.IN_PROGRESS:
        await set_session_status(tx, session.id, SessionStatus.IN_PROGRESS)
    turn = await transition_turn(tx.conn, turn, TurnStatus.IN_PROGRESS, started_at=time.time(), lease_token=job.lease_token)
    tx.emit(turn_event("in_progress", turn))
    for message in turn.input:
        item = await tx.insert_item(
            new_item(
                session_id=turn.session_id,
                turn_id=turn.id,
                type="message",
                data={"role": "user", "phase": None, "content": message["content"]},
            )
        )
        tx.emit(item_event("added", item, None))
    return turn
