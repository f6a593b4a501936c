"""`/v1/vaults` and `/v1/vaults/{id}/credentials` (spec §2.5): what `client.beta.agents.vaults`
calls. Vaults are not under `/agents` even though the client reaches them there.

Every key of a tenant may read its vaults and credentials (their settings; a secret value is
never shown by any endpoint); only an `admin` key creates, changes, rotates or deletes them.
A refused request stores nothing, and no error message shows a value that was sent.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cairn.api.context import RequestContext, request_context
from cairn.api.json_body import read_body, read_model
from cairn.api.params import list_params, metadata_filters, page_body
from cairn.api.vault_schemas import CreateCredentialBody, CreateVaultBody, UpdateCredentialBody, UpdateVaultBody
from cairn.engine.vaults import VaultService, render_credential, render_vault
from cairn.errors import InvalidRequestError

__all__ = ["routes"]

_STATUSES = ("active", "archived")


async def _managing(request: Request, what: str) -> tuple[RequestContext, VaultService]:
    ctx = await request_context(request)
    ctx.principal.require_admin(what)
    return ctx, VaultService(ctx.runtime)


async def _reading(request: Request) -> tuple[RequestContext, VaultService]:
    ctx = await request_context(request)
    return ctx, VaultService(ctx.runtime)


def _statuses(request: Request) -> set[str]:
    """The `status` filter (`status=active` or `status[]=active&status[]=archived`); both by default."""
    given = request.query_params.getlist("status") + request.query_params.getlist("status[]")
    for status in given:
        if status not in _STATUSES:
            raise InvalidRequestError(f"status must be one of {', '.join(_STATUSES)}", param="status")
    return set(given or _STATUSES)


def _deleted(object_id: str, kind: str) -> Response:
    return Response(json.dumps({"id": object_id, "object": kind, "deleted": True}), media_type="application/json")


# -- vaults ---------------------------------------------------------------------------------


async def create_vault(request: Request) -> Response:
    ctx, vaults = await _managing(request, "create vaults")
    body = read_model(await read_body(request, ctx.runtime.settings.max_body_bytes), CreateVaultBody)
    vault = await vaults.create_vault(ctx.principal.tenant, name=body.name, metadata=body.metadata or {})
    return JSONResponse(render_vault(vault))


async def retrieve_vault(request: Request) -> Response:
    ctx, vaults = await _reading(request)
    return JSONResponse(render_vault(await vaults.get_vault(ctx.principal.tenant, request.path_params["vault_id"])))


async def update_vault(request: Request) -> Response:
    ctx, vaults = await _managing(request, "change vaults")
    body = read_model(await read_body(request, ctx.runtime.settings.max_body_bytes), UpdateVaultBody)
    changes = body.model_dump(exclude_unset=True)
    vault = await vaults.update_vault(ctx.principal.tenant, request.path_params["vault_id"], changes)
    return JSONResponse(render_vault(vault))


async def list_all_vaults(request: Request) -> Response:
    ctx, vaults = await _reading(request)
    params = list_params(request)
    page = await vaults.list_vaults(
        ctx.principal.tenant, after=params.after, order=params.order, limit=params.limit,
        metadata=metadata_filters(request, known=("status", "status[]")), statuses=_statuses(request),
    )
    return JSONResponse(page_body(page, [render_vault(v) for v in page.data]))


async def delete_vault(request: Request) -> Response:
    ctx, vaults = await _managing(request, "delete vaults")
    vault_id = request.path_params["vault_id"]
    await vaults.delete_vault(ctx.principal.tenant, vault_id)
    return _deleted(vault_id, "vault.deleted")


# -- credentials ----------------------------------------------------------------------------


async def create_credential(request: Request) -> Response:
    ctx, vaults = await _managing(request, "create credentials")
    body = read_model(await read_body(request, ctx.runtime.settings.max_body_bytes), CreateCredentialBody)
    credential = await vaults.create_credential(
        ctx.principal.tenant, request.path_params["vault_id"], name=body.name, auth=body.auth.model_dump(),
        metadata=body.metadata or {},
    )
    return JSONResponse(render_credential(credential))


async def retrieve_credential(request: Request) -> Response:
    ctx, vaults = await _reading(request)
    credential = await vaults.get_credential(
        ctx.principal.tenant, request.path_params["vault_id"], request.path_params["credential_id"]
    )
    return JSONResponse(render_credential(credential))


async def update_credential(request: Request) -> Response:
    ctx, vaults = await _managing(request, "change or rotate credentials")
    body = read_model(await read_body(request, ctx.runtime.settings.max_body_bytes), UpdateCredentialBody)
    credential = await vaults.update_credential(
        ctx.principal.tenant, request.path_params["vault_id"], request.path_params["credential_id"],
        body.model_dump(exclude_unset=True),
    )
    return JSONResponse(render_credential(credential))


async def list_all_credentials(request: Request) -> Response:
    ctx, vaults = await _reading(request)
    params = list_params(request)
    page = await vaults.list_credentials(
        ctx.principal.tenant, request.path_params["vault_id"], after=params.after, order=params.order, limit=params.limit,
        metadata=metadata_filters(request, known=("status", "status[]")), statuses=_statuses(request),
    )
    return JSONResponse(page_body(page, [render_credential(c) for c in page.data]))


async def delete_credential(request: Request) -> Response:
    ctx, vaults = await _managing(request, "delete credentials")
    credential_id = request.path_params["credential_id"]
    await vaults.delete_credential(ctx.principal.tenant, request.path_params["vault_id"], credential_id)
    return _deleted(credential_id, "vault.credential.deleted")


routes = [
    Route("/v1/vaults", create_vault, methods=["POST"]),
    Route("/v1/vaults", list_all_vaults, methods=["GET"]),
    Route("/v1/vaults/{vault_id}", retrieve_vault, methods=["GET"]),
    Route("/v1/vaults/{vault_id}", update_vault, methods=["POST"]),
    Route("/v1/vaults/{vault_id}", delete_vault, methods=["DELETE"]),
    Route("/v1/vaults/{vault_id}/credentials", create_credential, methods=["POST"]),
    Route("/v1/vaults/{vault_id}/credentials", list_all_credentials, methods=["GET"]),
    Route("/v1/vaults/{vault_id}/credentials/{credential_id}", retrieve_credential, methods=["GET"]),
    Route("/v1/vaults/{vault_id}/credentials/{credential_id}", update_credential, methods=["POST"]),
    Route("/v1/vaults/{vault_id}/credentials/{credential_id}", delete_credential, methods=["DELETE"]),
]
