"""The HTTP app in-process over a test's engine harness: requests with keys of any role and
tenant, without a server or the app's lifespan (the test owns the runtime)."""

from __future__ import annotations

from typing import Any

import httpx
import httpx2
import openai
from starlette.types import ASGIApp, Receive, Scope, Send

from cairn.api.app import create_app
from cairn.engine.runtime import Runtime
from cairn.engine.sessions import SessionService
from cairn.store.keys import create_key
from tests.unit.engine.harness import EngineHarness


class _WithRuntime:
    """The app with its lifespan's state given directly: the test owns the runtime."""

    def __init__(self, app: ASGIApp, runtime: Runtime) -> None:
        self.app = app
        self.state = {"runtime": runtime, "sessions": SessionService(runtime)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app({**scope, "state": dict(self.state)}, receive, send)


class Api:
    def __init__(self, engine: EngineHarness) -> None:
        self.engine = engine
        self.keys: dict[str, str] = {}
        self.key_ids: dict[str, str] = {}

    async def key(self, role: str, tenant: str = "t1") -> str:
        name = f"{tenant}:{role}"
        if name not in self.keys:
            async with self.engine.runtime.db.write() as conn:
                record, secret = await create_key(conn, tenant=tenant, role=role)
            self.keys[name], self.key_ids[name] = secret, record.id
        return self.keys[name]

    async def call(self, method: str, path: str, role: str = "approver", tenant: str = "t1", **kwargs: Any) -> httpx.Response:
        app = in_process_app(self.engine.runtime)
        headers = {**kwargs.pop("headers", {}), "Authorization": f"Bearer {await self.key(role, tenant)}"}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cairn/v1") as http:
            return await http.request(method, path, headers=headers, **kwargs)


    async def official(self, role: str = "admin", tenant: str = "t1") -> openai.AsyncOpenAI:
        """The official client, as an application would use it, with a key of `role` in `tenant`."""
        transport = httpx2.ASGITransport(app=in_process_app(self.engine.runtime))
        http = httpx2.AsyncClient(transport=transport, base_url="http://cairn/v1")
        return openai.AsyncOpenAI(base_url="http://cairn/v1", api_key=await self.key(role, tenant), http_client=http, max_retries=0)


def in_process_app(runtime: Runtime) -> ASGIApp:
    """The HTTP app over `runtime`, with the state its lifespan would give it."""
    return _WithRuntime(create_app(_never_entered()), runtime)  # type: ignore[arg-type]


class _never_entered:  # noqa: N801 - stands in for the process context, which the test replaces
    async def __aenter__(self) -> Runtime:
        raise AssertionError("the app's lifespan is not run in these tests")

    async def __aexit__(self, *exc: object) -> None:
        return None
