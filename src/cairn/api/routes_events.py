"""`/v1/agents/sessions/{id}/events`: input events (POST, 202) and the event stream (GET, SSE).

The stream is live-only unless the caller asks for `starting_after=N` (a Cairn extension
the official client never sends): then every stored event after N is replayed first and
the stream continues live with no gap or duplicate (issue 5). Either way the response
header `x-cairn-starting-after` names the sequence number the stream starts after.
"""

from __future__ import annotations

import hashlib
import re

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cairn.api.context import request_context
from cairn.api.json_body import read_body, read_model
from cairn.api.params import parse_count
from cairn.api.schemas import EventsBody
from cairn.api.sse import event_stream, sse_response
from cairn.errors import InvalidRequestError

__all__ = ["STARTING_AFTER_HEADER", "routes"]

STARTING_AFTER_HEADER = "x-cairn-starting-after"

_MAX_IDEMPOTENCY_KEY = 255
_IDEMPOTENCY_KEY = re.compile(f"[\x20-\x7e]{{1,{_MAX_IDEMPOTENCY_KEY}}}")


async def post_events(request: Request) -> Response:
    ctx = await request_context(request)
    raw = await read_body(request, ctx.runtime.settings.max_body_bytes)
    body = read_model(raw, EventsBody)
    # Approval results are decisions, checked against the tool's approvers; any other input
    # writes to the session.
    if any(e.type != "agent.session.input.mcp_approval_request_result" for e in body.events):
        ctx.principal.require_write()
    key = request.headers.get("idempotency-key")
    idempotency = None
    if key is not None:
        if not _IDEMPOTENCY_KEY.fullmatch(key):
            raise InvalidRequestError(
                f"Idempotency-Key must be 1-{_MAX_IDEMPOTENCY_KEY} printable ASCII characters", param="Idempotency-Key"
            )
        idempotency = (key, hashlib.sha256(raw).hexdigest())
    events = [e.model_dump(exclude_none=True) for e in body.events]
    await ctx.sessions.submit(
        ctx.principal.tenant, request.path_params["session_id"], events, idempotency=idempotency, decider=ctx.principal.decider
    )
    return Response(status_code=202)


async def get_events(request: Request) -> Response:
    ctx = await request_context(request)
    session_id = request.path_params["session_id"]
    for name in request.query_params:
        if name not in ("include_obfuscation", "starting_after"):
            raise InvalidRequestError(f"unknown query parameter {name!r}", param=name)
    raw_after = request.query_params.get("starting_after")
    session = await ctx.sessions.get(ctx.principal.tenant, session_id)
    if raw_after is None:
        after = session.last_event_seq
    else:
        after = parse_count(raw_after, "starting_after")
        if after > session.last_event_seq:
            raise InvalidRequestError(
                f"starting_after={after} is beyond the session's last event ({session.last_event_seq})",
                param="starting_after",
            )
    # The position the stream starts after, so a client that subscribes live can resume
    # from it if the connection drops before the first event arrives.
    return sse_response(event_stream(ctx.runtime, session_id, after), headers={STARTING_AFTER_HEADER: str(after)})


routes = [
    Route("/v1/agents/sessions/{session_id}/events", post_events, methods=["POST"]),
    Route("/v1/agents/sessions/{session_id}/events", get_events, methods=["GET"]),
]
