"""In-process wake-ups and fan-out: "session S appended these events", "a job was queued".

Only a latency optimisation over the event log, never a second source of truth. After a
journal transaction commits (design invariant 1: durable before sent), its records are
handed to every `Subscription` of the session in this process, so a subscriber that is
caught up sends them without reading the database. Each subscription buffers at most
`max_buffered` records: `publish` never waits, so a slow subscriber cannot block the turn
or other subscribers; one that falls further behind loses its buffer and reads the log
from its own position instead (`Subscription.take` reports that). Appends made by other
processes arrive by polling the database, so a subscriber also wakes every poll interval.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import anyio

from cairn.store.events import EventRecord

__all__ = ["DEFAULT_MAX_BUFFERED", "Notifier", "Published", "Subscription"]

DEFAULT_MAX_BUFFERED = 4096


class Published:
    """The records of one committed transaction (contiguous sequence numbers), shared by
    every subscriber, with their wire encoding computed once for all of them."""

    __slots__ = ("_encoded", "first_seq", "last_seq", "records")

    def __init__(self, records: Sequence[EventRecord]) -> None:
        self.records = records
        self.first_seq = records[0].seq
        self.last_seq = records[-1].seq
        self._encoded: bytes | None = None

    def encoded(self, encode: Callable[[Sequence[EventRecord]], bytes]) -> bytes:
        """`encode(records)`, computed by the first subscriber that asks (all use the same encoding)."""
        if self._encoded is None:
            self._encoded = encode(self.records)
        return self._encoded


class Subscription:
    """One subscriber's bounded inbox of freshly committed records for one session."""

    __slots__ = ("_buffer", "_buffered", "_overflowed", "_wakeup", "max_buffered", "session_id")

    def __init__(self, session_id: str, max_buffered: int) -> None:
        self.session_id = session_id
        self.max_buffered = max_buffered
        self._buffer: list[Published] = []
        self._buffered = 0
        self._overflowed = False
        self._wakeup = anyio.Event()

    def _offer(self, published: Published) -> None:
        if not self._overflowed:
            if self._buffered + len(published.records) > self.max_buffered:
                # Too far behind: drop the buffer; the subscriber catches up from the log.
                self._buffer, self._buffered = [], 0
                self._overflowed = True
            else:
                self._buffer.append(published)
                self._buffered += len(published.records)
        self._wakeup.set()

    def _nudge(self) -> None:
        self._wakeup.set()

    def take(self) -> tuple[list[Published], bool]:
        """Return (buffered transactions in publish order, whether some were dropped) and empty the inbox.

        Publish order need not be sequence order: two transactions of one session can
        finish their commits in either order. The caller sorts, and reads the log when the
        records do not continue its position without a gap.
        """
        records, overflowed = self._buffer, self._overflowed
        self._buffer, self._buffered, self._overflowed = [], 0, False
        if self._wakeup.is_set():
            self._wakeup = anyio.Event()
        return records, overflowed

    def has_pending(self) -> bool:
        """Whether records were published (or dropped) since the last `take`."""
        return bool(self._buffer) or self._overflowed

    async def wait(self, timeout_s: float) -> None:
        """Return when something was published or nudged since the last `take`, or after `timeout_s`."""
        if self._wakeup.is_set():
            return  # no cancel scope needed: the common case under load
        with anyio.move_on_after(timeout_s):
            await self._wakeup.wait()


class Notifier:
    def __init__(self, *, max_buffered: int = DEFAULT_MAX_BUFFERED) -> None:
        self.max_buffered = max_buffered
        self._subscriptions: dict[str, set[Subscription]] = {}
        self._jobs = anyio.Event()

    def session_changed(self, session_id: str, records: Sequence[EventRecord] = ()) -> None:
        """Wake everything waiting on the session; `records` are committed events to fan out."""
        subscriptions = self._subscriptions.get(session_id)
        if not subscriptions:
            return
        published = Published(records) if records else None
        for subscription in subscriptions:
            if published is not None:
                subscription._offer(published)
            else:
                subscription._nudge()

    @contextmanager
    def subscribe(self, session_id: str) -> Iterator[Subscription]:
        """Receive the session's records published from now on, until the block exits."""
        subscription = Subscription(session_id, self.max_buffered)
        self._subscriptions.setdefault(session_id, set()).add(subscription)
        try:
            yield subscription
        finally:
            subscribers = self._subscriptions.get(session_id)
            if subscribers is not None:
                subscribers.discard(subscription)
                if not subscribers:
                    del self._subscriptions[session_id]

    def subscriber_count(self, session_id: str) -> int:
        return len(self._subscriptions.get(session_id, ()))

    def job_queued(self) -> None:
        self._jobs.set()
        self._jobs = anyio.Event()

    async def wait_job(self, timeout_s: float) -> None:
        event = self._jobs
        with anyio.move_on_after(timeout_s):
            await event.wait()
