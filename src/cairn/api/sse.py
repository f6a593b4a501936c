"""Server-sent events under spec §1.9: `data: <one JSON object>` frames, no `id:` lines,
comment keepalives on idle streams.

A subscriber tails the event log from a sequence number: it reads what is stored after
its position, sends it, and waits for a wake-up (or one poll interval, to see other
processes' appends). Live and replayed delivery are the same code path, so there is no
seam to lose or duplicate an event at, and a slow subscriber only delays itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse

from cairn.engine.runtime import Runtime
from cairn.errors import CairnError
from cairn.store.events import EventRecord, read_events_after
from cairn.store.sessions import get_session

__all__ = ["KEEPALIVE", "event_stream", "frame", "sse_response"]

log = logging.getLogger(__name__)

KEEPALIVE = b": keepalive\n\n"
_BATCH = 500


def frame(data: str) -> bytes:
    return b"data: " + data.encode() + b"\n\n"


def error_frame(message: str, code: str) -> bytes:
    return frame(json.dumps({"type": "error", "event_id": f"evt_error_{time.time_ns()}", "error": {"type": "server_error", "message": message, "code": code}}))


async def event_stream(
    runtime: Runtime, session_id: str, after_seq: int, *, until: Callable[[EventRecord], bool] | None = None
) -> AsyncIterator[bytes]:
    """Yield every event after `after_seq`, then live ones; ends when `until` says so or the session is deleted."""
    settings = runtime.settings
    position = after_seq
    # The first bytes flush the response headers at once (spec §6.2: the client blocks until they arrive).
    yield KEEPALIVE
    last_sent = time.monotonic()
    while True:
        async with runtime.db.read() as conn:
            batch = await read_events_after(conn, session_id, position, limit=_BATCH)
            exists = bool(batch) or await get_session(conn, session_id) is not None
        if not exists:
            return
        for record in batch:
            yield frame(record.data)
            position = record.seq
            if until is not None and until(record):
                return
        if batch:
            last_sent = time.monotonic()
            if len(batch) == _BATCH:
                continue
        elif time.monotonic() - last_sent >= settings.keepalive_s:
            yield KEEPALIVE
            last_sent = time.monotonic()
        await runtime.notifier.wait_session(session_id, settings.poll_interval_s)


async def _guarded(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """After the headers are sent a failure can only be told in-band: an `error` event (§1.9.5)."""
    try:
        async for chunk in body:
            yield chunk
    except CairnError as exc:
        log.error("event stream failed: %s", exc.message, exc_info=exc)
        yield error_frame(exc.message, exc.code)


def sse_response(body: AsyncIterator[bytes], **kwargs: Any) -> StreamingResponse:
    return StreamingResponse(
        _guarded(body),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        **kwargs,
    )
