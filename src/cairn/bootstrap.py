"""The composition root: settings → database, blob store, snapshot store, sandbox, models, the
operator's agents, engine.

Every process builds itself here and nowhere else: `cairn serve` (the API, with or without an
embedded worker), `cairn worker` (jobs only), the test servers and the benchmarks. `api/`
receives a built runtime and only speaks HTTP; `worker/` receives one and only runs jobs; they
never import each other.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import anyio

from cairn.blobs import BlobStore
from cairn.config import Settings
from cairn.durable.keyring import LocalKeyring
from cairn.durable.sealing import Sealer
from cairn.engine.approvals import ApprovalGate
from cairn.engine.environment import Environments
from cairn.engine.idle import persist_all_workspaces
from cairn.engine.journal import Journal, wake_on_topic
from cairn.engine.ledger import LedgerReserve
from cairn.engine.notifier import Notifier
from cairn.engine.runtime import Runtime
from cairn.engine.tools import ToolPolicies
from cairn.engine.tools.workspace import BUILTIN_TOOLS
from cairn.errors import InvalidRequestError
from cairn.models.registry import check_model_name, resolve_model
from cairn.operator import LoadedAgents, load_agents
from cairn.redaction import redacted_log_records
from cairn.sandbox import select_backend
from cairn.sandbox.egress import EgressCA, EgressProxy
from cairn.snapshots import SnapshotStore, SnapshotStoreConfig, open_snapshot_store
from cairn.store.db import Database
from cairn.store.jobs import has_claimable_job
from cairn.store.migrate import check_schema
from cairn.worker.background import run_periodically, supervise
from cairn.worker.service import WorkerService

__all__ = ["build_runtime", "build_snapshot_store", "load_operator_agents", "open_runtime", "running", "serving_process"]

log = logging.getLogger(__name__)

_WAL_CHECKPOINT_INTERVAL_S = 1.0
# How often a process with workers looks whether another process committed to SQLite.
_SQLITE_WATCH_INTERVAL_S = 0.005


async def _wake_for_jobs(runtime: Runtime) -> None:
    """Another connection committed: wake the job loop if there is a job to claim now."""
    if await has_claimable_job(runtime.db):
        runtime.notifier.job_queued()


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


def load_operator_agents(settings: Settings) -> LoadedAgents:
    """The operator's agents (`Settings.agents`, MODULE:ATTR), built with this process's runtime
    dependencies; none without the setting. Raises `AgentDefinitionError` saying what is wrong."""
    return load_agents(settings.agents, BUILTIN_TOOLS)


def build_runtime(settings: Settings, db: Database, agents: LoadedAgents | None = None) -> Runtime:
    """Every long-lived collaborator of the engine, over an open database; `agents` when the
    caller loaded them already (the CLI, to report a bad `--agents` before serving)."""
    sandbox = select_backend(settings.sandbox)
    # One egress proxy per process, with the data dir's CA (docs/security.md, "Egress").
    egress = EgressProxy(settings.egress, EgressCA.load_or_create(settings.data_dir))
    sandbox.use_egress(egress)
    notifier = Notifier()
    journal = Journal(db, notifier)
    if agents is None:
        agents = load_operator_agents(settings)
    blobs = BlobStore(settings.blobs_dir)
    # Every side-effecting call runs under the idempotency ledger (docs/ledger.md); the gate
    # hands it the approved calls that may already have run.
    # The master keys: CAIRN_MASTER_KEY, or the data dir's key file (made on first start).
    sealer = Sealer(LocalKeyring.from_settings(settings))
    ledger = LedgerReserve(db, blobs, sealer, settings)
    return Runtime(
        settings=settings,
        db=db,
        notifier=notifier,
        journal=journal,
        sandbox=sandbox,
        blobs=blobs,
        environments=Environments(settings.workspaces_dir, sandbox, build_snapshot_store(settings), db),
        resolve_model=partial(resolve_model, settings=settings),
        check_model=partial(check_model_name, settings=settings),
        sealer=sealer,
        # A call that its agent says needs a person's approval waits for one (docs/approvals.md).
        tool_policies=ToolPolicies(gate=ApprovalGate(journal, agents, settings, sealer, reserve=ledger), reserve=ledger),
        agents=agents,
        egress=egress,
    )


@asynccontextmanager
async def open_runtime(settings: Settings, agents: LoadedAgents | None = None) -> AsyncIterator[Runtime]:
    """A runtime on the configured database (its schema checked, never migrated here).

    On the way out every workspace this process holds is persisted, shielded from
    cancellation, so stopping a process never loses one.
    """
    db = Database(settings.resolved_database_url)
    try:
        await check_schema(db)
        runtime = build_runtime(settings, db, agents)
        log.info("sandbox backend: %s", runtime.sandbox.name)
        try:
            with redacted_log_records(runtime.redactors):
                yield runtime
        finally:
            with anyio.CancelScope(shield=True):
                await persist_all_workspaces(runtime)
                await runtime.environments.snapshots.aclose()
    finally:
        await db.dispose()


@asynccontextmanager
async def running(runtime: Runtime, *, workers: int) -> AsyncIterator[WorkerService | None]:
    """The process's background tasks until the block ends: change notifications in every
    process, and with `workers` > 0 the job loop and the care of workspaces and blobs.

    Yields the worker service (None without workers), so the caller can drain it before the
    block ends; whatever still runs then is cancelled, and a cancelled job is handed back.
    """
    async with anyio.create_task_group() as tg:
        db = runtime.db
        if db.is_sqlite:
            checkpoint = db.checkpoint_best_effort
            tg.start_soon(run_periodically, "wal-checkpoints", _WAL_CHECKPOINT_INTERVAL_S, checkpoint, name="wal-checkpoints")
        else:
            listen = partial(db.listen, partial(wake_on_topic, runtime.notifier))
            tg.start_soon(supervise, "change-listener", listen, name="change-listener")
        service = WorkerService(runtime, concurrency=workers) if workers > 0 else None
        if service is not None:
            if db.is_sqlite:
                # Another process's queued job (a decision in an API-only server, say) is claimed
                # within milliseconds instead of at the next poll.
                watch = partial(db.watch_commits, partial(_wake_for_jobs, runtime), interval_s=_SQLITE_WATCH_INTERVAL_S)
                tg.start_soon(supervise, "sqlite-job-watch", watch, name="sqlite-job-watch")
            service.start(tg)
        yield service
        tg.cancel_scope.cancel()


@asynccontextmanager
async def serving_process(settings: Settings, agents: LoadedAgents | None = None) -> AsyncIterator[Runtime]:
    """What `cairn serve` runs beside the HTTP app: the runtime and, with `settings.workers`,
    a worker drained for up to `settings.drain_grace_s` when the server stops."""
    async with open_runtime(settings, agents) as runtime, running(runtime, workers=settings.workers) as service:
        try:
            yield runtime
        finally:
            if service is not None:
                with anyio.CancelScope(shield=True):
                    await service.drain(settings.drain_grace_s)
