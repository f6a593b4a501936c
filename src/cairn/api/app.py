"""The application factory: the only place that wires Cairn's HTTP app together.

`create_app(process)` receives the process built by `cairn.bootstrap` as a context that
yields its runtime, entered for the app's lifespan, and builds nothing at import time; the
app only speaks HTTP. Jobs, workspaces and maintenance belong to the process's worker
(`cairn.bootstrap.running`), never to the app.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cairn.api import (
    routes_agents,
    routes_approvals,
    routes_artifacts,
    routes_events,
    routes_items,
    routes_ledger,
    routes_sessions,
    routes_vaults,
)
from cairn.api.errors import EXCEPTION_HANDLERS
from cairn.engine.runtime import Runtime
from cairn.engine.sessions import SessionService
from cairn.ids import new_item_id

__all__ = ["create_app"]


class _RequestId:
    """Adds `x-request-id` to every response (the client exposes it as `exc.request_id`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = f"req_{new_item_id().removeprefix('item_')}".encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id)]
            await send(message)

        await self.app(scope, receive, send_with_id)


async def _healthz(request: Request) -> Response:
    """Unauthenticated liveness probe for load balancers and process supervisors."""
    return JSONResponse({"status": "ok"})


def create_app(process: AbstractAsyncContextManager[Runtime]) -> Starlette:
    """The HTTP app over the runtime `process` yields; routes reach it, and the session
    commands, as request state. The process is entered at startup and left at shutdown."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        async with process as runtime:
            yield {"runtime": runtime, "sessions": SessionService(runtime)}

    return Starlette(
        routes=[
            Route("/healthz", _healthz, methods=["GET"]),
            *routes_sessions.routes,
            *routes_events.routes,
            *routes_items.routes,
            *routes_artifacts.routes,
            *routes_agents.routes,
            *routes_approvals.routes,
            *routes_ledger.routes,
            *routes_vaults.routes,
        ],
        middleware=[Middleware(_RequestId)],
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
