"""`cairn snapshots list|show|restore|gc`: operator commands over the deployment's snapshot store.

The top-level CLI owns argument parsing and settings; this module adds the `snapshots`
command group and its async handlers. Wiring, in `cairn/cli.py`:

    commands = parser.add_subparsers(dest="command", required=True)
    add_snapshot_commands(commands, open_store=lambda args: open_snapshot_store(settings.snapshots))
    args = parser.parse_args(argv)
    return anyio.run(args.run, args)      # every handler is `async (Namespace) -> int`

Handlers print to `args.stdout` / `args.stderr` when set (tests), else sys.stdout / sys.stderr,
and always close the store they opened. Restores draw a progress bar on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

from cairn.snapshots.base import SnapshotStore
from cairn.snapshots.exclusions import Exclusions
from cairn.snapshots.gc import Retention
from cairn.snapshots.ids import SnapshotScope, parse_snapshot_id
from cairn.snapshots.models import SnapshotInfo
from cairn.snapshots.progress import ProgressBar

__all__ = ["StoreFactory", "add_snapshot_commands"]

StoreFactory = Callable[[argparse.Namespace], SnapshotStore]
Handler = Callable[[argparse.Namespace, SnapshotStore], Awaitable[int]]


def add_snapshot_commands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], *, open_store: StoreFactory
) -> argparse.ArgumentParser:
    """Register `snapshots` and its subcommands; each sets `args.run` to its async handler."""
    parser = subparsers.add_parser("snapshots", help="list, inspect, restore and garbage-collect workspace snapshots")
    commands = parser.add_subparsers(dest="snapshots_command", required=True)

    def add(name: str, help_text: str, handler: Handler) -> argparse.ArgumentParser:
        command = commands.add_parser(name, help=help_text)
        command.add_argument("--tenant", default="default", help="tenant id (default: %(default)s)")

        async def run(args: argparse.Namespace) -> int:
            store = open_store(args)
            try:
                return await handler(args, store)
            finally:
                await store.aclose()

        command.set_defaults(run=run)
        return command

    listing = add("list", "list a session's snapshots, oldest first", _list)
    listing.add_argument("session", help="session id")
    listing.add_argument("--json", action="store_true", help="one JSON header per line")

    show = add("show", "show one snapshot's header", _show)
    show.add_argument("session", help="session id")
    show.add_argument("snapshot_id", help="snapshot id (see `list`)")

    restore = add("restore", "restore a snapshot (the latest by default) into a directory", _restore)
    restore.add_argument("session", help="session id")
    restore.add_argument("snapshot_id", nargs="?", help="snapshot id (default: the latest)")
    restore.add_argument("--workspace", required=True, type=Path, help="directory to restore into")
    restore.add_argument("--exclude", action="append", default=[], help="path to leave untouched (repeatable)")

    gc = add("gc", "apply retention and delete content no kept snapshot references", _gc)
    gc.add_argument("--keep-last", type=int, default=10, help="snapshots kept per session (default: %(default)s)")
    gc.add_argument("--keep-within-s", type=float, default=None, help="also keep snapshots younger than this")
    gc.add_argument(
        "--grace-s",
        type=float,
        default=3600.0,
        help="unreferenced content is deleted only after this long (default: %(default)s); "
        "0 deletes at once and is unsafe while persists run",
    )
    return parser


def _out(args: argparse.Namespace) -> TextIO:
    stream: TextIO = getattr(args, "stdout", None) or sys.stdout
    return stream


def _err(args: argparse.Namespace) -> TextIO:
    stream: TextIO = getattr(args, "stderr", None) or sys.stderr
    return stream


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"


async def _list(args: argparse.Namespace, store: SnapshotStore) -> int:
    snapshots = await store.list_snapshots(SnapshotScope(args.tenant, args.session))
    out = _out(args)
    if args.json:
        for info in snapshots:
            out.write(info.model_dump_json() + "\n")
        return 0
    out.write(f"{'SNAPSHOT':<42} {'CREATED (UTC)':<20} {'FILES':>7} {'SIZE':>12} {'NEW':>12}\n")
    for info in snapshots:
        created = info.created_at.strftime("%Y-%m-%d %H:%M:%S")
        out.write(
            f"{info.snapshot_id:<42} {created:<20} {info.file_count:>7} "
            f"{_mib(info.total_bytes):>12} {_mib(info.new_bytes):>12}\n"
        )
    if not snapshots:
        _err(args).write(f"session {args.session} has no snapshots\n")
    return 0


async def _show(args: argparse.Namespace, store: SnapshotStore) -> int:
    info = await store.get_snapshot(SnapshotScope(args.tenant, args.session), parse_snapshot_id(args.snapshot_id))
    _out(args).write(json.dumps(_describe(info), indent=2) + "\n")
    return 0


def _describe(info: SnapshotInfo) -> dict[str, Any]:
    document: dict[str, Any] = info.model_dump(mode="json")
    document["pack_count"] = len(document.pop("packs"))
    return document


async def _restore(args: argparse.Namespace, store: SnapshotStore) -> int:
    scope = SnapshotScope(args.tenant, args.session)
    snapshot_id = parse_snapshot_id(args.snapshot_id) if args.snapshot_id else None
    bar = ProgressBar(_err(args), "restore")
    result = await store.restore(
        scope,
        args.workspace,
        snapshot_id=snapshot_id,
        exclusions=Exclusions(ephemeral=args.exclude),
        progress=bar,
    )
    bar.finish()
    info = result.snapshot
    _out(args).write(
        f"restored {info.snapshot_id} ({info.file_count} files, {_mib(info.total_bytes)}) into {args.workspace}\n"
    )
    return 0


async def _gc(args: argparse.Namespace, store: SnapshotStore) -> int:
    retention = Retention(keep_last=args.keep_last, keep_within_s=args.keep_within_s)
    report = await store.gc(args.tenant, retention, grace_s=args.grace_s)
    _out(args).write(
        f"snapshots deleted: {report.snapshots_deleted}, orphan trees deleted: {report.orphan_trees_deleted}\n"
        f"packs condemned: {report.packs_condemned}, pardoned: {report.packs_pardoned}, "
        f"deleted: {report.packs_deleted} ({_mib(report.bytes_freed)} freed), "
        f"abandoned writes removed: {report.abandoned_writes_removed}\n"
    )
    return 0
