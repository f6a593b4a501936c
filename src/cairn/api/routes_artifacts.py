"""Artifacts of a session: list, retrieve, download content, delete.

Content is served from the content-addressed blob store, so it stays downloadable after
the workspace is gone.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from cairn.api.context import RequestContext, request_context
from cairn.api.params import list_params, page_body
from cairn.errors import NotFoundError
from cairn.store.artifacts import ArtifactRecord, delete_artifact, get_artifact, list_artifacts

__all__ = ["routes"]


async def _artifact(ctx: RequestContext, request: Request) -> ArtifactRecord:
    session = await ctx.sessions.get(ctx.principal.tenant, request.path_params["session_id"])
    artifact_id = request.path_params["artifact_id"]
    async with ctx.runtime.db.read() as conn:
        record = await get_artifact(conn, session.id, artifact_id)
    if record is None:
        raise NotFoundError(f"No artifact found with id '{artifact_id}'.", param="artifact_id")
    return record


async def list_all(request: Request) -> Response:
    ctx = await request_context(request)
    session = await ctx.sessions.get(ctx.principal.tenant, request.path_params["session_id"])
    params = list_params(request)
    async with ctx.runtime.db.read() as conn:
        page = await list_artifacts(
            conn,
            session.id,
            environment_id=request.query_params.get("environment_id"),
            after=params.after,
            order=params.order,
            limit=params.limit,
        )
    return JSONResponse(page_body(page, [a.wire() for a in page.data]))


async def retrieve(request: Request) -> Response:
    ctx = await request_context(request)
    return JSONResponse((await _artifact(ctx, request)).wire())


async def content(request: Request) -> Response:
    ctx = await request_context(request)
    record = await _artifact(ctx, request)
    blobs = ctx.runtime.blobs
    return StreamingResponse(
        blobs.iter_chunks(record.sha256),
        media_type="application/octet-stream",
        headers={"Content-Length": str(record.size_bytes)},
    )


async def delete(request: Request) -> Response:
    ctx = await request_context(request, write=True)
    record = await _artifact(ctx, request)
    async with ctx.runtime.db.write() as conn:
        await delete_artifact(conn, record.id)
    body = {"id": record.id, "object": "agent.session.artifact.deleted", "deleted": True}
    return Response(json.dumps(body), media_type="application/json")


routes = [
    Route("/v1/agents/sessions/{session_id}/artifacts", list_all, methods=["GET"]),
    Route("/v1/agents/sessions/{session_id}/artifacts/{artifact_id}", retrieve, methods=["GET"]),
    Route("/v1/agents/sessions/{session_id}/artifacts/{artifact_id}", delete, methods=["DELETE"]),
    Route("/v1/agents/sessions/{session_id}/artifacts/{artifact_id}/content", content, methods=["GET"]),
]
