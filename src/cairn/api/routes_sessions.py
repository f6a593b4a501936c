"""`/v1/agents/sessions`: create (JSON or streamed), list, retrieve, update, delete."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cairn.api.context import request_context
from cairn.api.json_body import read_body, read_model
from cairn.api.params import list_params, metadata_filters, page_body
from cairn.api.schemas import CreateSessionBody, UpdateSessionBody
from cairn.api.sse import event_stream, sse_response
from cairn.engine.wire import render_session
from cairn.store.events import EventRecord
from cairn.store.sessions import list_sessions

__all__ = ["routes"]


async def create_session(request: Request) -> Response:
    ctx = await request_context(request, write=True)
    body = read_model(await read_body(request, ctx.runtime.settings.max_body_bytes), CreateSessionBody)
    created = await ctx.sessions.create(
        ctx.principal.tenant,
        {
            "agent": body.agent.model_dump(exclude_none=True) if body.agent is not None else {},
            "agent_id": body.agent_id,
            "environment": body.environment.model_dump(exclude_none=True),
            "metadata": body.metadata,
            "input": body.input_messages(),
            "prompt_cache_options": body.prompt_cache_options.model_dump() if body.prompt_cache_options else None,
            "review": body.review,
            "spend_control": body.spend_control.model_dump() if body.spend_control else None,
            "vault_ids": body.vault_ids or [],
        },
    )
    if not body.stream:
        return JSONResponse(render_session(created.session))
    root_turn = created.turn_id
    ended = False

    def until(record: EventRecord) -> bool:
        # Close after the initial turn's terminal event and the idle that follows (spec §6.1).
        nonlocal ended
        if record.turn_id == root_turn and record.type in (
            "agent.session.turn.completed", "agent.session.turn.failed", "agent.session.turn.cancelled",
        ):
            ended = True
        return record.type == "agent.session.failed" or (ended and record.type == "agent.session.idle")

    return sse_response(event_stream(ctx.runtime, created.session.id, created.first_event_seq - 1, until=until))


async def list_all(request: Request) -> Response:
    ctx = await request_context(request)
    params = list_params(request)
    metadata = metadata_filters(request, known=("agent_id",))
    async with ctx.runtime.db.read() as conn:
        page = await list_sessions(
            conn, ctx.principal.tenant, after=params.after, order=params.order, limit=params.limit, metadata=metadata,
            agent_id=request.query_params.get("agent_id"),
        )
    return JSONResponse(page_body(page, [render_session(s) for s in page.data]))


async def retrieve(request: Request) -> Response:
    ctx = await request_context(request)
    session = await ctx.sessions.get(ctx.principal.tenant, request.path_params["session_id"])
    return JSONResponse(render_session(session))


async def update(request: Request) -> Response:
    ctx = await request_context(request, write=True)
    body = read_model(await read_body(request, ctx.runtime.settings.max_body_bytes), UpdateSessionBody)
    changes = body.model_dump(exclude_unset=True)
    if body.agent is not None:
        changes["agent"] = body.agent.model_dump(exclude_unset=True)
    session = await ctx.sessions.update(ctx.principal.tenant, request.path_params["session_id"], changes)
    return JSONResponse(render_session(session))


async def delete(request: Request) -> Response:
    ctx = await request_context(request, write=True)
    session_id = request.path_params["session_id"]
    await ctx.sessions.delete(ctx.principal.tenant, session_id)
    return Response(
        json.dumps({"id": session_id, "object": "agent.session.deleted", "deleted": True}), media_type="application/json"
    )


routes = [
    Route("/v1/agents/sessions", create_session, methods=["POST"]),
    Route("/v1/agents/sessions", list_all, methods=["GET"]),
    Route("/v1/agents/sessions/{session_id}", retrieve, methods=["GET"]),
    Route("/v1/agents/sessions/{session_id}", update, methods=["POST"]),
    Route("/v1/agents/sessions/{session_id}", delete, methods=["DELETE"]),
]
