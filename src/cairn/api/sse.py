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

from cairn.engine.notifier import Published
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


def frames(records: Sequence[EventRecord]) -> bytes:
    return b"".join([b"data: " + r.data.encode() + b"\n\n" for r in records])


def _continuing(published: list[Published], position: int) -> list[Published | EventRecord] | None:
    """What of `published` follows `position` without a gap, in order; None if there is a gap.

    Whole transactions are passed on as they are (their encoding is shared by every
    subscriber); one that the log already partly delivered is cut down to its new records.
    """
    out: list[Published | EventRecord] = []
    expected = position + 1
    for batch in sorted(published, key=lambda b: b.first_seq):
        if batch.last_seq < expected:
            continue  # already sent, from the log
        if batch.first_seq > expected:
            return None
        if batch.first_seq == expected:
            out.append(batch)
        else:
            out.extend(batch.records[expected - batch.first_seq :])
        expected = batch.last_seq + 1
    return out


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
            fresh = None if must_read or overflowed else _continuing(published, position)
            if fresh is None:
                async with runtime.db.read() as conn:
                    batch = await read_events_after(conn, session_id, position, limit=_BATCH)
                    if not batch and await get_session(conn, session_id) is None:
                        return
                # A full batch may have more behind it; otherwise we are caught up to
                # this read, and the inbox (filled since `take`) holds what followed it.
                must_read = len(batch) == _BATCH
                fresh = list(batch)
            if fresh:
                if until is not None:
                    records = [r for item in fresh for r in (item.records if isinstance(item, Published) else (item,))]
                    for index, record in enumerate(records):
                        if until(record):
                            yield frames(records[: index + 1])
                            return
                    yield frames(records)
                    position = records[-1].seq
                else:
                    yield b"".join([i.encoded(frames) if isinstance(i, Published) else frames((i,)) for i in fresh])
                    last = fresh[-1]
                    position = last.last_seq if isinstance(last, Published) else last.seq
                last_sent = time.monotonic()
            if must_read:
                continue
            if not fresh and time.monotonic() - last_sent >= settings.keepalive_s:
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
