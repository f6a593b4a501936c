"""In-process wake-ups: "something changed for session S" and "a job was queued".

Only a latency optimisation. Subscribers and workers also poll the database, so a change
made by another process is seen within one poll interval; a change made in this process
wakes them at once.
"""

from __future__ import annotations

import anyio

__all__ = ["Notifier"]


class Notifier:
    def __init__(self) -> None:
        self._sessions: dict[str, anyio.Event] = {}
        self._jobs = anyio.Event()

    def session_changed(self, session_id: str) -> None:
        event = self._sessions.pop(session_id, None)
        if event is not None:
            event.set()

    async def wait_session(self, session_id: str, timeout_s: float) -> None:
        """Return when `session_changed(session_id)` is called or `timeout_s` passes."""
        event = self._sessions.get(session_id)
        if event is None:
            event = self._sessions[session_id] = anyio.Event()
        with anyio.move_on_after(timeout_s):
            await event.wait()

    def job_queued(self) -> None:
        self._jobs.set()
        self._jobs = anyio.Event()

    async def wait_job(self, timeout_s: float) -> None:
        event = self._jobs
        with anyio.move_on_after(timeout_s):
            await event.wait()
