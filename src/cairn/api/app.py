"""The application factory: the only place that wires Cairn's HTTP app together.

`create_app(settings)` builds nothing at import time. Its lifespan opens the database
(checking, not migrating, the schema), picks the sandbox backend, and runs the embedded
worker, with the periodic care of idle workspaces, snapshots and artifact blobs, in a task
group that is cancelled on shutdown.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cairn.api import routes_artifacts, routes_events, routes_items, routes_sessions
from cairn.api.errors import EXCEPTION_HANDLERS
from cairn.blobs import BlobStore
from cairn.config import Settings
from cairn.engine.environment import Environments
from cairn.engine.idle import persist_all_workspaces
from cairn.errors import InvalidRequestError
from cairn.snapshots import SnapshotStore, SnapshotStoreConfig, open_snapshot_store
from cairn.engine.journal import Journal, wake_on_topic
from cairn.engine.notifier import Notifier
from cairn.engine.runtime import Runtime
from cairn.engine.sessions import SessionService
from cairn.ids import new_item_id
from cairn.models.registry import check_model_name, resolve_model
from cairn.sandbox import select_backend
from cairn.store.db import Database
from cairn.store.migrate import check_schema
from cairn.worker.background import run_periodically, supervise
from cairn.worker.service import start_worker_tasks

__all__ = ["build_runtime", "build_snapshot_store", "create_app"]

log = logging.getLogger(__name__)


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


def build_snapshot_store(settings: Settings) -> SnapshotStore:
    """The deployment's snapshot store, chosen by `Settings.snapshot_store`."""
    if settings.snapshot_store not in ("local", "s3", "none"):
        raise InvalidRequestError(
            f"unknown snapshot store {settings.snapshot_store!r}: use local, s3 or none", param="CAIRN_SNAPSHOT_STORE"
        )
    return open_snapshot_store(
        SnapshotStoreConfig(
            backend=settings.snapshot_store,  # type: ignore[arg-type]
            local_root=settings.snapshots_dir,
            s3_bucket=settings.s3_bucket,
            s3_prefix=settings.s3_prefix,
            s3_endpoint_url=settings.s3_endpoint_url,
        )
    )


def build_runtime(settings: Settings, db: Database) -> Runtime:
    sandbox = select_backend(settings.sandbox)
    notifier = Notifier()
    return Runtime(
        settings=settings,
        db=db,
        notifier=notifier,
        journal=Journal(db, notifier),
        sandbox=sandbox,
        blobs=BlobStore(settings.blobs_dir),
        environments=Environments(settings.workspaces_dir, sandbox, build_snapshot_store(settings)),
        resolve_model=partial(resolve_model, settings=settings),
        check_model=partial(check_model_name, settings=settings),
    )


def create_app(settings: Settings) -> Starlette:
    """The app; with `settings.workers == 0` it serves the API only and runs no jobs."""
    run_worker = settings.workers > 0

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        db = Database(settings.resolved_database_url)
        try:
            await check_schema(db)
            runtime = build_runtime(settings, db)
            log.info("sandbox backend: %s", runtime.sandbox.name)
            try:
                async with anyio.create_task_group() as tg:
                    if db.is_sqlite:
                        tg.start_soon(run_periodically, "wal-checkpoints", 1.0, db.checkpoint_best_effort, name="wal-checkpoints")
                    else:
                        listen = partial(db.listen, partial(wake_on_topic, runtime.notifier))
                        tg.start_soon(supervise, "change-listener", listen, name="change-listener")
                    if run_worker:
                        start_worker_tasks(tg, runtime, concurrency=settings.workers)
                    yield {"runtime": runtime, "sessions": SessionService(runtime)}
                    tg.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    await persist_all_workspaces(runtime)
                    await runtime.environments.snapshots.aclose()
        finally:
            await db.dispose()

    return Starlette(
        routes=[
            Route("/healthz", _healthz, methods=["GET"]),
            *routes_sessions.routes,
            *routes_events.routes,
            *routes_items.routes,
            *routes_artifacts.routes,
        ],
        middleware=[Middleware(_RequestId)],
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
