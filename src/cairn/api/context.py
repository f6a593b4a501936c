"""What every route needs: the runtime, the session service and the authenticated caller."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from cairn.api.auth import Principal, authenticate
from cairn.api.text import check_names
from cairn.engine.runtime import Runtime
from cairn.engine.sessions import SessionService

__all__ = ["RequestContext", "request_context"]


@dataclass(frozen=True, slots=True)
class RequestContext:
    runtime: Runtime
    sessions: SessionService
    principal: Principal


async def request_context(request: Request, *, write: bool = False) -> RequestContext:
    """Authenticate the caller and check the request's ids and query parameters (issue 19)."""
    runtime: Runtime = request.state.runtime
    principal = await authenticate(request, runtime)
    check_names(request.path_params.items(), kind="path parameter")
    check_names(request.query_params.multi_items(), kind="query parameter")
    if write:
        principal.require_write()
    return RequestContext(runtime=runtime, sessions=request.state.sessions, principal=principal)
