"""`/v1/ledger`: list, retrieve and resolve the idempotency ledger's entries (docs/ledger.md).

Every key of a tenant may read its entries (what its tools did, under which operation key);
resolving an `uncertain` one is for the tenant's `admin` and `approver` keys, and continues
the turn that waits for it (`cairn.engine.ledger.resolve_effect`). A refused request stores
nothing.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cairn.api.context import request_context
from cairn.api.json_body import read_body, read_model
from cairn.api.params import known_params, list_params, page_body, status_filter
from cairn.api.schemas import ResolveBody
from cairn.engine.ledger import render_entry, resolve_effect, shown_result
from cairn.errors import NotFoundError
from cairn.states import LedgerStatus
from cairn.store.ledger import get_entry, list_entries

__all__ = ["routes"]


async def list_all(request: Request) -> Response:
    ctx = await request_context(request)
    params = list_params(request)
    known_params(request, known=("status",))
    status = status_filter(request, LedgerStatus)
    async with ctx.runtime.db.read() as conn:
        page = await list_entries(
            conn,
            ctx.principal.tenant,
            status=status,
            after=params.after,
            order=params.order,
            limit=params.limit,
        )
        shown = [render_entry(e, await shown_result(conn, ctx.runtime.blobs, ctx.runtime.sealer, e)) for e in page.data]
    return JSONResponse(page_body(page, shown))


async def retrieve(request: Request) -> Response:
    ctx = await request_context(request)
    operation_key = request.path_params["operation_key"]
    async with ctx.runtime.db.read() as conn:
        entry = await get_entry(conn, operation_key, tenant=ctx.principal.tenant)
        if entry is None:
            raise NotFoundError(f"No ledger entry found with operation key '{operation_key}'.", param="operation_key")
        return JSONResponse(render_entry(entry, await shown_result(conn, ctx.runtime.blobs, ctx.runtime.sealer, entry)))


async def resolve(request: Request) -> Response:
    ctx = await request_context(request)
    settings = ctx.runtime.settings
    body = read_model(await read_body(request, settings.max_body_bytes), ResolveBody)
    entry = await resolve_effect(
        ctx.runtime.journal, ctx.runtime.blobs, ctx.runtime.sealer, ctx.principal.decider, request.path_params["operation_key"],
        output=body.succeeded, error=body.failed, inline_bytes=settings.ledger_result_inline_bytes,
    )
    async with ctx.runtime.db.read() as conn:
        return JSONResponse(render_entry(entry, await shown_result(conn, ctx.runtime.blobs, ctx.runtime.sealer, entry)))


routes = [
    Route("/v1/ledger", list_all, methods=["GET"]),
    Route("/v1/ledger/{operation_key}", retrieve, methods=["GET"]),
    Route("/v1/ledger/{operation_key}/resolve", resolve, methods=["POST"]),
]
