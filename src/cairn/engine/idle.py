"""Background care of workspaces: idle suspension, persist on shutdown, snapshot retention.

A session idle for `Settings.idle_stop_s` has its live workspace lifecycle stopped (persist
only) and shut down, and emits `agent.session.environment.suspended`. The next turn's
start emits the environment events again (spec §4). On a graceful shutdown every live
workspace is persisted, so a restart never loses one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable

from cairn.engine.events import environment_event
from cairn.engine.runtime import Runtime
from cairn.errors import CairnError
from cairn.snapshots import Retention
from cairn.states import EnvironmentStatus, SessionStatus
from cairn.store.sessions import get_session, list_tenants, set_environment_status

__all__ = ["apply_snapshot_retention", "idle_check_interval_s", "persist_all_workspaces", "suspend_idle_sessions"]

log = logging.getLogger(__name__)


async def _suspend(rt: Runtime, session_id: str) -> None:
    try:
        await rt.environments.suspend(session_id)
    except CairnError as exc:
        log.warning("persisting the workspace of %s failed: %s", session_id, exc.message)
        async with rt.journal.transaction(session_id) as tx:
            session = await get_session(tx.conn, session_id)
            if session is not None:
                tx.emit(environment_event("failed", session, status="failed"))
        return
    async with rt.journal.transaction(session_id) as tx:
        session = await set_environment_status(tx.conn, session_id, EnvironmentStatus.SUSPENDED)
        if session is None:
            return
        tx.emit(environment_event("suspended", session, status="suspended"))


async def suspend_idle_sessions(rt: Runtime) -> None:
    """Suspend this process's live workspaces whose sessions have been idle long enough.

    One session's failure is logged and the others still go: a workspace that cannot be
    persisted must not keep every other from being suspended (issue 19).
    """
    deadline = time.time() - rt.settings.idle_stop_s
    for session_id in rt.environments.live_sessions():
        try:
            async with rt.db.read() as conn:
                session = await get_session(conn, session_id)
        except Exception:
            log.exception("reading session %s to suspend it failed", session_id)
            continue
        if session is None:
            # Deleted: a removal job removes its files; this process only lets go of them.
            await _best_effort("releasing the workspace of deleted session", session_id, rt.environments.forget(session_id))
        elif session.status == SessionStatus.IDLE and session.last_active_at <= deadline:
            await _best_effort("suspending the workspace of", session_id, _suspend(rt, session_id))


async def _best_effort(action: str, session_id: str, work: Awaitable[None]) -> None:
    """Await `work`, logging an unexpected failure instead of raising it, so the next session goes on."""
    try:
        await work
    except Exception:
        log.exception("%s %s failed", action, session_id)


def idle_check_interval_s(rt: Runtime) -> float:
    """How often to look for idle sessions: a quarter of the idle time, within 0.2-30 s."""
    return max(0.2, min(30.0, rt.settings.idle_stop_s / 4))


async def persist_all_workspaces(rt: Runtime) -> None:
    """On shutdown: persist every live workspace (shield the caller from cancellation)."""
    for session_id in rt.environments.live_sessions():
        await _best_effort("persisting the workspace of", session_id, _suspend(rt, session_id))


async def apply_snapshot_retention(rt: Runtime) -> None:
    """Apply snapshot retention to every tenant (run every `snapshot_gc_interval_s`)."""
    retention = Retention(keep_last=rt.settings.snapshot_keep_last)
    async with rt.db.read() as conn:
        tenants = await list_tenants(conn)
    for tenant in tenants:
        try:
            report = await rt.environments.snapshots.gc(tenant, retention)
        except CairnError as exc:
            log.warning("snapshot garbage collection for tenant %s failed: %s", tenant, exc.message)
            continue
        except Exception:
            # One tenant's failure must not keep the others' retention from running.
            log.exception("snapshot garbage collection for tenant %s failed", tenant)
            continue
        if report.snapshots_deleted or report.packs_deleted:
            log.info("snapshot gc for %s: %s", tenant, report)
