"""The egress proxy's reports, appended to the log of the session they concern.

A connection the proxy refused (`agent.session.environment.network_blocked`), a
credential placeholder sent where that credential is not allowed
(`agent.session.environment.credential_withheld`), a secret the proxy replaced by its
placeholder in a response (`agent.session.environment.credential_redacted`) and a
response whose encoding kept the proxy from reading its content
(`agent.session.environment.response_encoded`) are never silent: the program got a 403,
its placeholder went out unchanged or it read something else than the service sent, and
the session's log says so, with the host, the port and the reason (and how many similar
events the proxy's rate limit dropped before this one). Nothing of the connection's
content is in it.
"""

from __future__ import annotations

from typing import Any

from cairn.engine.runtime import Runtime
from cairn.sandbox.egress import EgressEvent
from cairn.store.sessions import SessionRecord, get_session

__all__ = ["egress_event", "record_egress_events"]


def egress_event(event: EgressEvent, session: SessionRecord) -> dict[str, Any]:
    return {
        "type": f"agent.session.environment.{event.kind}",
        "session_id": session.id,
        "turn_id": None,
        "environment": {
            "id": session.environment_id,
            "type": session.environment["type"],
            "status": session.environment_status.value if session.environment_status else "ready",
        },
        "network": {"host": event.host, "port": event.port, "reason": event.reason, "suppressed": event.suppressed},
    }


async def record_egress_events(rt: Runtime) -> None:
    """Append every event the sandbox's egress proxy reports, as it comes (runs until cancelled)."""
    if rt.egress is None:
        return
    while True:
        for event in await rt.egress.reports.next_batch():
            async with rt.journal.transaction(event.session_id) as tx:
                session = await get_session(tx.conn, event.session_id)
                if session is not None:  # a session deleted since: nothing to tell
                    tx.emit(egress_event(event, session))
