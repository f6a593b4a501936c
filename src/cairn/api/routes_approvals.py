"""`/v1/approvals`: list, retrieve, approve, reject, revoke (docs/approvals.md).

Every key of a tenant may read its approvals; a decision is judged by the rules every way
of deciding shares (`cairn.engine.approvals.decide`). A refused request stores nothing.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cairn.api.context import RequestContext, request_context
from cairn.api.json_body import read_body, read_model
from cairn.api.params import known_params, list_params, page_body, status_filter
from cairn.api.schemas import ApproveBody, RejectBody, RevokeBody
from cairn.engine.approvals import Decision, DecisionRequest, decide, show_approval
from cairn.errors import NotFoundError
from cairn.states import ApprovalStatus
from cairn.store.approvals import get_approval, list_approvals

__all__ = ["routes"]

_FILTERS = ("status", "session_id", "tool_name")


async def list_all(request: Request) -> Response:
    ctx = await request_context(request)
    params = list_params(request)
    known_params(request, known=_FILTERS)
    status = status_filter(request, ApprovalStatus)
    query = request.query_params
    async with ctx.runtime.db.read() as conn:
        page = await list_approvals(
            conn,
            ctx.principal.tenant,
            status=status,
            session_id=query.get("session_id"),
            tool_name=query.get("tool_name"),
            after=params.after,
            order=params.order,
            limit=params.limit,
        )
        shown = [await show_approval(ctx.runtime.sealer, conn, a) for a in page.data]
    return JSONResponse(page_body(page, shown))


async def retrieve(request: Request) -> Response:
    ctx = await request_context(request)
    approval_id = request.path_params["approval_id"]
    async with ctx.runtime.db.read() as conn:
        approval = await get_approval(conn, approval_id, tenant=ctx.principal.tenant)
        if approval is None:
            raise NotFoundError(f"No approval found with id '{approval_id}'.", param="approval_id")
        return JSONResponse(await show_approval(ctx.runtime.sealer, conn, approval))


async def _decide(request: Request, ctx: RequestContext, decision: DecisionRequest) -> Response:
    approval = await decide(ctx.runtime.journal, ctx.principal.decider, request.path_params["approval_id"], decision)
    async with ctx.runtime.db.read() as conn:
        return JSONResponse(await show_approval(ctx.runtime.sealer, conn, approval))


async def approve(request: Request) -> Response:
    ctx = await request_context(request)
    body = read_model(await read_body(request, ctx.runtime.settings.max_body_bytes), ApproveBody)
    return await _decide(request, ctx, DecisionRequest(Decision.APPROVE, arguments_digest=body.arguments_digest))


async def reject(request: Request) -> Response:
    ctx = await request_context(request)
    body = read_model(await read_body(request, ctx.runtime.settings.max_body_bytes), RejectBody)
    return await _decide(request, ctx, DecisionRequest(Decision.REJECT, message=body.message))


async def revoke(request: Request) -> Response:
    ctx = await request_context(request)
    body = read_model(await read_body(request, ctx.runtime.settings.max_body_bytes), RevokeBody)
    return await _decide(request, ctx, DecisionRequest(Decision.REVOKE, message=body.reason))


routes = [
    Route("/v1/approvals", list_all, methods=["GET"]),
    Route("/v1/approvals/{approval_id}", retrieve, methods=["GET"]),
    Route("/v1/approvals/{approval_id}/approve", approve, methods=["POST"]),
    Route("/v1/approvals/{approval_id}/reject", reject, methods=["POST"]),
    Route("/v1/approvals/{approval_id}/revoke", revoke, methods=["POST"]),
]
