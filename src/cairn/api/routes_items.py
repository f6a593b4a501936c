"""Items and turns of a session: `/items`, `/turns`, `/turns/{id}`, `/turns/{id}/items`."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cairn.api.context import request_context
from cairn.api.params import list_params, page_body
from cairn.engine.events import agent_id_of
from cairn.engine.wire import render_turn
from cairn.errors import NotFoundError
from cairn.store.items import list_items
from cairn.store.turns import get_turn, list_turns

__all__ = ["routes"]


async def items(request: Request) -> Response:
    ctx = await request_context(request)
    session = await ctx.sessions.get(ctx.principal.tenant, request.path_params["session_id"])
    params = list_params(request)
    async with ctx.runtime.db.read() as conn:
        page = await list_items(conn, session.id, after=params.after, order=params.order, limit=params.limit)
    return JSONResponse(page_body(page, [i.wire() for i in page.data]))


async def turns(request: Request) -> Response:
    ctx = await request_context(request)
    session = await ctx.sessions.get(ctx.principal.tenant, request.path_params["session_id"])
    params = list_params(request)
    async with ctx.runtime.db.read() as conn:
        page = await list_turns(conn, session.id, after=params.after, order=params.order, limit=params.limit)
    agent_id = agent_id_of(session.id)
    return JSONResponse(page_body(page, [render_turn(t, agent_id=agent_id) for t in page.data]))


async def turn(request: Request) -> Response:
    ctx = await request_context(request)
    session = await ctx.sessions.get(ctx.principal.tenant, request.path_params["session_id"])
    turn_id = request.path_params["turn_id"]
    async with ctx.runtime.db.read() as conn:
        record = await get_turn(conn, turn_id, session_id=session.id)
    if record is None:
        raise NotFoundError(f"No turn found with id '{turn_id}'.", param="turn_id")
    return JSONResponse(render_turn(record, agent_id=agent_id_of(session.id)))


async def turn_items(request: Request) -> Response:
    ctx = await request_context(request)
    session = await ctx.sessions.get(ctx.principal.tenant, request.path_params["session_id"])
    turn_id = request.path_params["turn_id"]
    params = list_params(request)
    async with ctx.runtime.db.read() as conn:
        if await get_turn(conn, turn_id, session_id=session.id) is None:
            raise NotFoundError(f"No turn found with id '{turn_id}'.", param="turn_id")
        page = await list_items(conn, session.id, turn_id=turn_id, after=params.after, order=params.order, limit=params.limit)
    return JSONResponse(page_body(page, [i.wire() for i in page.data]))


routes = [
    Route("/v1/agents/sessions/{session_id}/items", items, methods=["GET"]),
    Route("/v1/agents/sessions/{session_id}/turns", turns, methods=["GET"]),
    Route("/v1/agents/sessions/{session_id}/turns/{turn_id}", turn, methods=["GET"]),
    Route("/v1/agents/sessions/{session_id}/turns/{turn_id}/items", turn_items, methods=["GET"]),
]
