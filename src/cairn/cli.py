"""The `cairn` command: serve, worker, keys, approvals, ledger, secrets, db, blobs, snapshots, doctor, demo.

Every subcommand runs its async work with `anyio.run`; errors a user can fix end in a
one-line message and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import anyio

from cairn._concurrency import run_sync
from cairn.blobs import BlobStore
from cairn.config import Settings, check_seconds
from cairn.errors import CairnError
from cairn.snapshots import SnapshotStore
from cairn.store.db import Database
from cairn.store.keys import ROLES, create_key, list_keys, revoke_key, set_role
from cairn.store.migrate import current_revision, head_revision, upgrade

__all__ = ["main"]

log = logging.getLogger("cairn")


def _settings(args: argparse.Namespace) -> Settings:
    settings = Settings(
        data_dir=Path(args.data_dir),
        database_url=getattr(args, "database_url", None),
        scripts_dir=Path(args.scripts_dir).resolve() if getattr(args, "scripts_dir", None) else None,
        host=getattr(args, "host", "127.0.0.1"),
        port=getattr(args, "port", 8321),
        sandbox=getattr(args, "sandbox", None),
        agents=getattr(args, "agents", None),
    ).with_env()
    if getattr(args, "workers", None) is not None:
        if args.workers < 0:
            raise CairnError("--workers must be 0 or more", code="invalid_argument")
        settings = replace(settings, workers=args.workers)
    return settings


def _make_data_dir(settings: Settings) -> None:
    # Traversable but not listable by others: the sandbox's unprivileged uid must reach
    # the workspaces below it, while the database, keys and blobs keep modes of their own.
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.data_dir, 0o711)


def _restrict_database_files(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.chmod(path + suffix, 0o600)


async def prepare_data_dir(settings: Settings) -> str | None:
    """Create the data dir, migrate an empty database, and mint the first admin key.

    Returns the admin key when it was created now. An existing database at an older
    schema is not touched: that needs an explicit `cairn db upgrade`.
    """
    _make_data_dir(settings)
    db = Database(settings.resolved_database_url)
    try:
        if await current_revision(db) is None:
            await upgrade(db)
        if db.is_sqlite and db.url.database:
            await run_sync(_restrict_database_files, db.url.database)
        async with db.write() as conn:
            if await list_keys(conn):
                return None
            _, secret = await create_key(conn, tenant="default", role="admin")
        key_path = settings.admin_key_path
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")
        return secret
    finally:
        await db.dispose()


async def _serve(settings: Settings) -> None:
    import uvicorn

    from cairn.api.app import create_app
    from cairn.bootstrap import load_operator_agents, serving_process

    agents = load_operator_agents(settings)  # a bad --agents ends here, before anything is served
    if await prepare_data_dir(settings):
        print(f"created admin API key in {settings.admin_key_path}", file=sys.stderr)
    # Event streams stay open indefinitely: give them a bounded grace period on shutdown,
    # then close them; clients resume from their last sequence number. The worker is
    # drained after that, in the app's lifespan (uvicorn owns the signals here).
    config = uvicorn.Config(
        create_app(serving_process(settings, agents)),
        host=settings.host,
        port=settings.port,
        log_level="info",
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    await server.serve()
    if not server.started:
        raise CairnError(f"the server did not start (is {settings.host}:{settings.port} free?)", code="serve_failed")


async def _worker(settings: Settings) -> None:
    """Run jobs without HTTP until SIGTERM or SIGINT: the first drains (no new job; running
    turns get `drain_grace_s` to end their step and hand their job back), a second stops now."""
    from cairn.bootstrap import load_operator_agents, open_runtime, running

    if settings.workers < 1:
        raise CairnError("cairn worker needs --workers 1 or more", code="invalid_argument")
    agents = load_operator_agents(settings)
    _make_data_dir(settings)
    async with open_runtime(settings, agents) as runtime, running(runtime, workers=settings.workers) as service:
        assert service is not None
        log.info("worker started: %d job slot(s) on %s", settings.workers, runtime.db.url.render_as_string())
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for received in signals:
                log.info("%s: draining (grace %.0f s; send it again to stop now)", signal.Signals(received).name, settings.drain_grace_s)
                break
            async with anyio.create_task_group() as tg:

                async def stop_on_second_signal() -> None:
                    async for _ in signals:
                        log.warning("second signal: stopping now; running jobs are handed back")
                        tg.cancel_scope.cancel()

                tg.start_soon(stop_on_second_signal)
                if not await service.drain(settings.drain_grace_s):
                    log.warning("jobs still ran after the grace period; they are handed back")
                tg.cancel_scope.cancel()


async def _keys(args: argparse.Namespace, settings: Settings) -> None:
    db = Database(settings.resolved_database_url)
    try:
        from cairn.store.migrate import check_schema

        await check_schema(db)
        async with db.write() as conn:
            if args.keys_command == "create":
                record, secret = await create_key(conn, tenant=args.tenant, role=args.role)
                print(json.dumps({"id": record.id, "tenant": record.tenant, "role": record.role, "key": secret}))
            elif args.keys_command == "list":
                for key in await list_keys(conn):
                    print(json.dumps({"id": key.id, "tenant": key.tenant, "role": key.role, "revoked": key.revoked_at is not None}))
            elif args.keys_command == "set-role":
                changed = await set_role(conn, args.key_id, args.role)
                if changed is None:
                    raise CairnError(f"no live key with id {args.key_id!r}", code="not_found")
                print(json.dumps({"id": changed.id, "tenant": changed.tenant, "role": changed.role}))
            elif not await revoke_key(conn, args.key_id):
                raise CairnError(f"no live key with id {args.key_id!r}", code="not_found")
    finally:
        await db.dispose()


async def _db(args: argparse.Namespace, settings: Settings) -> None:
    _make_data_dir(settings)
    db = Database(settings.resolved_database_url)
    try:
        if args.db_command == "upgrade":
            await upgrade(db)
        current = await current_revision(db)
        print(json.dumps({"revision": current, "head": head_revision(), "current": current == head_revision()}))
    finally:
        await db.dispose()


async def _blobs(args: argparse.Namespace, settings: Settings) -> int:
    """`blobs gc`: one sweep; exit status 1 when some files could not be deleted."""
    from cairn.engine.blob_gc import collect_blob_garbage
    from cairn.store.migrate import check_schema

    if not await run_sync(settings.data_dir.is_dir):
        raise CairnError(f"no data directory at {settings.data_dir}", code="not_found")
    grace_s = settings.blob_gc_grace_s if args.grace_s is None else check_seconds(args.grace_s, "--grace-s")
    db = Database(settings.resolved_database_url)
    try:
        await check_schema(db)
        report = await collect_blob_garbage(db, BlobStore(settings.blobs_dir), grace_s=grace_s, dry_run=args.dry_run)
    finally:
        await db.dispose()
    print(json.dumps(dataclasses.asdict(report)))
    if report.failures:
        print(f"cairn: {report.failures} file(s) could not be deleted; see the warnings above", file=sys.stderr)
        return 1
    return 0


def _demo(args: argparse.Namespace) -> None:
    from cairn.demo import run_demo

    data_dir = Path(args.data_dir) if args.data_dir else None
    result = run_demo(model=args.model, output_dir=Path(args.output_dir), data_dir=data_dir)
    if not result.succeeded:
        raise CairnError(f"the demo failed: {result.failure}", code="demo_failed")


def _doctor(settings: Settings) -> None:
    from cairn.sandbox.doctor import describe_host

    print(describe_host(settings.sandbox, settings.egress))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cairn", description="A durable runtime for LLM agents in sandboxed workspaces.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=os.environ.get("CAIRN_DATA_DIR", ".cairn"), help="state directory (default ./.cairn)")
    common.add_argument("--database-url", default=None, help="sqlite:///PATH or postgresql://… (default: SQLite in the data dir)")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", parents=[common], help="run the API server with an embedded worker")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8321)
    serve.add_argument("--scripts-dir", default=None, help="directory of scripted:NAME model scripts")
    serve.add_argument("--sandbox", default=None, help="sandbox backend (default: the best isolating one)")
    serve.add_argument("--workers", type=int, default=None, help="turns run at once by this process; 0 = API only (default 4)")
    serve.add_argument("--agents", default=None, metavar="MODULE:ATTR", help="the operator's agents: MODULE:ATTR of a cairn.AgentRegistry, importable from the working directory or PYTHONPATH")

    worker = sub.add_parser("worker", parents=[common], help="run turns without serving HTTP (beside `serve --workers 0`)")
    worker.add_argument("--scripts-dir", default=None, help="directory of scripted:NAME model scripts")
    worker.add_argument("--sandbox", default=None, help="sandbox backend (default: the best isolating one)")
    worker.add_argument("--workers", type=int, default=None, help="turns run at once by this process (default 4)")
    worker.add_argument("--agents", default=None, metavar="MODULE:ATTR", help="the operator's agents: MODULE:ATTR of a cairn.AgentRegistry, importable from the working directory or PYTHONPATH")

    keys = sub.add_parser("keys", parents=[common], help="manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", parents=[common], help="create a key and print it once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--role", required=True, choices=ROLES)
    keys_sub.add_parser("list", parents=[common], help="list keys (never their secrets)")
    revoke = keys_sub.add_parser("revoke", parents=[common], help="revoke a key by id")
    revoke.add_argument("key_id")
    set_role_parser = keys_sub.add_parser("set-role", parents=[common], help="give a key another role")
    set_role_parser.add_argument("key_id")
    set_role_parser.add_argument("role", choices=ROLES)

    from cairn.approvals_cli import add_approval_commands

    add_approval_commands(sub)

    from cairn.ledger_cli import add_ledger_commands

    add_ledger_commands(sub)

    from cairn.secrets_cli import add_secret_commands

    add_secret_commands(sub, common)

    db = sub.add_parser("db", parents=[common], help="database schema")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser("upgrade", parents=[common], help="migrate the schema to this version of Cairn")
    db_sub.add_parser("status", parents=[common], help="print the schema revision")

    blobs = sub.add_parser("blobs", parents=[common], help="artifact content in the blob store")
    blobs_sub = blobs.add_subparsers(dest="blobs_command", required=True)
    gc = blobs_sub.add_parser(
        "gc", parents=[common], help="delete content no artifact references; print what was freed (JSON)"
    )
    gc.add_argument(
        "--grace-s",
        type=float,
        default=None,
        help="keep content stored less than this long ago (default: CAIRN_BLOB_GC_GRACE_S, 3600); "
        "0 is safe for stored data but fails turns that are publishing at that moment",
    )
    gc.add_argument("--dry-run", action="store_true", help="report what would be freed, delete nothing")

    demo = sub.add_parser("demo", help="run the tree.py tutorial on a fresh server and print it live")
    demo.add_argument("--model", default=None, help="model to use (default: OpenAI endpoint, local model, or scripted)")
    demo.add_argument("--output-dir", default="cairn-demo-output", help="where the published tree.py is saved")
    demo.add_argument("--data-dir", default=None, help="keep the server's state here (default: a temporary directory)")

    from cairn.snapshots import add_snapshot_commands

    def open_store(args: argparse.Namespace) -> SnapshotStore:
        from cairn.bootstrap import build_snapshot_store

        return build_snapshot_store(Settings(data_dir=Path(args.data_dir)).with_env())

    snapshots = add_snapshot_commands(sub, open_store=open_store)
    snapshots.add_argument("--data-dir", default=os.environ.get("CAIRN_DATA_DIR", ".cairn"), help="state directory (default ./.cairn)")

    doctor = sub.add_parser("doctor", parents=[common], help="show the sandbox backend, its isolation and limits")
    doctor.add_argument("--sandbox", default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    level = logging.INFO if args.command in ("serve", "worker") else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "demo":
            _demo(args)
            return 0
        settings = _settings(args)
        if args.command == "serve":
            anyio.run(_serve, settings)
        elif args.command == "worker":
            anyio.run(_worker, settings)
        elif args.command == "keys":
            anyio.run(_keys, args, settings)
        elif args.command in ("approvals", "ledger"):
            args.run(args, settings)
        elif args.command == "secrets":
            from cairn.secrets_cli import run_secrets

            return int(anyio.run(run_secrets, args, settings))
        elif args.command == "db":
            anyio.run(_db, args, settings)
        elif args.command == "blobs":
            return int(anyio.run(_blobs, args, settings))
        elif args.command == "doctor":
            _doctor(settings)
        elif args.command == "snapshots":
            return int(anyio.run(args.run, args))
    except CairnError as exc:
        print(f"cairn: error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
