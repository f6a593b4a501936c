"""Server-sent events under spec §1.9: `data: <one JSON object>` frames, no `id:` lines,
comment keepalives on idle streams.

A subscriber tails the event log from a sequence number. It subscribes to this process's
fan-out first, then alternates between two sources that both carry committed records
only (design invariant 1): records freshly published by this process's journal, used
when they continue its position without a gap, and the log itself, read from its
position whenever they do not (a replay, another process's appends, a buffer dropped
because the subscriber fell behind). Every record is checked against the position, so
nothing is sent twice or out of order, and live and replayed delivery meet without a
seam. `publish` never waits for a subscriber: a slow one only delays itself, and reads
the log at its own pace once it is too far behind. It wakes at least every poll interval
to see other processes' appends and a deleted session, which ends the stream.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from starlette.responses import StreamingResponse

from cairn.engine.runtime import Runtime
from cairn.errors import CairnError
from cairn.store.events import EventRecord, read_events_after
from cairn.store.sessions import get_session

__all__ = ["KEEPALIVE", "event_stream", "frame", "sse_response"]

log = logging.getLogger(__name__)

KEEPALIVE = b": keepalive\n\n"
# Records read from the log per query while catching up; also the most sent in one chunk.
_BATCH = 1000


def frame(data: str) -> bytes:
    return b"data: " + data.encode() + b"\n\n"


def error_frame(message: str, code: str) -> bytes:
    return frame(json.dumps({"type": "error", "event_id": f"evt_error_{time.time_ns()}", "error": {"type": "server_error", "message": message, "code": code}}))


def _continuing(records: Sequence[EventRecord], position: int) -> list[EventRecord] | None:
    """The records after `position` if, sorted, they follow it without a gap; else None."""
    fresh = sorted((r for r in records if r.seq > position), key=lambda r: r.seq)
    expected = position + 1
    unique = []
    for record in fresh:
        if record.seq < expected:
            continue  # published twice? never sent twice
        if record.seq != expected:
            return None
        unique.append(record)
        expected += 1
    return unique


async def event_stream(
    runtime: Runtime, session_id: str, after_seq: int, *, until: Callable[[EventRecord], bool] | None = None
) -> AsyncGenerator[bytes, None]:
    """Yield every event after `after_seq`, then live ones; ends when `until` says so or the session is deleted."""
    settings = runtime.settings
    position = after_seq
    # Subscribe before the first read of the log: a record committed after that read is
    # then certainly published to us, and one committed before it is in what we read.
    with runtime.notifier.subscribe(session_id) as subscription:
        # The first bytes flush the response headers at once (spec §6.2: the client blocks until they arrive).
        yield KEEPALIVE
        last_sent = time.monotonic()
        must_read = True
        while True:
            published, overflowed = subscription.take()
            batch = None if must_read or overflowed else _continuing(published, position)
            if batch is None:
                async with runtime.db.read() as conn:
                    batch = await read_events_after(conn, session_id, position, limit=_BATCH)
                    if not batch and await get_session(conn, session_id) is None:
                        return
                # A full batch may have more behind it; otherwise we are caught up to
                # this read, and the inbox (filled since `take`) holds what followed it.
                must_read = len(batch) == _BATCH
            for start in range(0, len(batch), _BATCH):
                chunks = []
                for record in batch[start : start + _BATCH]:
                    chunks.append(frame(record.data))
                    position = record.seq
                    if until is not None and until(record):
                        yield b"".join(chunks)
                        return
                yield b"".join(chunks)
                last_sent = time.monotonic()
            if must_read:
                continue
            if not batch and time.monotonic() - last_sent >= settings.keepalive_s:
                yield KEEPALIVE
                last_sent = time.monotonic()
            await subscription.wait(settings.poll_interval_s)
            # Woken by the poll timer or a bare nudge (such as a delete): look at the log.
            must_read = not subscription.has_pending()


async def _guarded(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """After the headers are sent a failure can only be told in-band: an `error` event (§1.9.5)."""
    try:
        async for chunk in body:
            yield chunk
    except CairnError as exc:
        log.error("event stream failed: %s", exc.message, exc_info=exc)
        yield error_frame(exc.message, exc.code)


def sse_response(body: AsyncIterator[bytes], *, headers: Mapping[str, str] | None = None, **kwargs: Any) -> StreamingResponse:
    return StreamingResponse(
        _guarded(body),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        **kwargs,
    )
