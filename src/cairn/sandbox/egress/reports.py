"""What the egress proxy tells a session's log: refused connections, withheld and redacted
credentials, responses it could not read.

The proxy's thread hands each `EgressEvent` to `EgressReports.report`, which drops
repeats (the same session, kind, host and port within `REPEAT_S`) and anything beyond
`PER_SESSION_PER_MINUTE` events of a session in a minute, so a program retrying in a loop
cannot flood the log; a dropped event is counted and the count travels with the next one
that passes. The worker takes the events in batches (`next_batch`, on its own event
loop) and appends them to each session's log.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

__all__ = ["PER_SESSION_PER_MINUTE", "REPEAT_S", "EgressEvent", "EgressKind", "EgressReports"]

REPEAT_S = 60.0
PER_SESSION_PER_MINUTE = 20
_QUEUE_MAX = 10_000

# What happened: a connection refused, a placeholder passed on unchanged (its credential is
# not allowed there), a secret redacted from a response, a response whose content could
# not be read (encoded).
EgressKind = Literal["network_blocked", "credential_withheld", "credential_redacted", "response_encoded"]


@dataclass(frozen=True, slots=True)
class EgressEvent:
    session_id: str
    kind: EgressKind
    host: str
    port: int
    reason: str
    suppressed: int = 0  # events of this session dropped by the rate limit since the last one


class EgressReports:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[EgressEvent] = deque(maxlen=_QUEUE_MAX)
        self._last: dict[tuple[str, str, str, int], float] = {}
        self._recent: dict[str, deque[float]] = {}
        self._suppressed: dict[str, int] = {}
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def report(self, event: EgressEvent) -> bool:
        """Queue `event` unless the rate limit drops it; True if queued. Thread-safe."""
        now = time.monotonic()
        key = (event.session_id, event.kind, event.host, event.port)
        with self._lock:
            recent = self._recent.setdefault(event.session_id, deque())
            while recent and now - recent[0] > 60.0:
                recent.popleft()
            last = self._last.get(key)
            if (last is not None and now - last < REPEAT_S) or len(recent) >= PER_SESSION_PER_MINUTE:
                self._suppressed[event.session_id] = self._suppressed.get(event.session_id, 0) + 1
                return False
            self._last[key] = now
            recent.append(now)
            suppressed = self._suppressed.pop(event.session_id, 0)
            if suppressed:
                event = EgressEvent(event.session_id, event.kind, event.host, event.port, event.reason, suppressed)
            self._queue.append(event)
            if len(self._last) > _QUEUE_MAX:
                self._last = {k: t for k, t in self._last.items() if now - t < REPEAT_S}
            waiter = self._waiter
        if waiter is not None:
            try:
                waiter[0].call_soon_threadsafe(waiter[1].set)
            except RuntimeError:
                pass  # the consumer's loop is closed: the event waits for the next consumer
        return True

    async def next_batch(self) -> list[EgressEvent]:
        """Wait for events and take every one queued (one consumer at a time)."""
        event = asyncio.Event()
        with self._lock:
            self._waiter = (asyncio.get_running_loop(), event)
        try:
            while True:
                with self._lock:
                    if self._queue:
                        batch = list(self._queue)
                        self._queue.clear()
                        return batch
                await event.wait()
                event.clear()
        finally:
            with self._lock:
                self._waiter = None
