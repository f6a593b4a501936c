"""`cairn secrets status|rotate-master`: the master keys of encryption at rest.

Both work on the database and the keyring directly, like `cairn keys`: run them with the data
dir (or `CAIRN_MASTER_KEY`) and the database the servers use. `rotate-master` may run while
servers and workers run: they follow the key file's new version (docs/security.md). Each
prints JSON; `rotate-master` ends with status 1 when some data key could not be re-wrapped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from cairn._concurrency import run_sync
from cairn.config import Settings, check_seconds
from cairn.durable.keyring import LocalKeyring
from cairn.durable.rotation import SETTLE_S, rotate_master
from cairn.store.data_keys import count_by_version
from cairn.store.db import Database
from cairn.store.migrate import check_schema

__all__ = ["add_secret_commands", "run_secrets"]


def add_secret_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `secrets` and its subcommands to the `cairn` parser's subparsers `sub`."""
    secrets = sub.add_parser("secrets", parents=[common], help="the master keys of encryption at rest")
    commands = secrets.add_subparsers(dest="secrets_command", required=True)
    commands.add_parser("status", parents=[common], help="the keyring's versions and how many data keys each wraps (JSON)")
    rotate = commands.add_parser(
        "rotate-master", parents=[common],
        help="re-wrap every data key with a new master key version (the key file) or the highest one in CAIRN_MASTER_KEY",
    )
    rotate.add_argument(
        "--settle-s", type=float, default=SETTLE_S,
        help=f"how long running processes get to notice the new key before the old one is dropped (default {SETTLE_S:g})",
    )


def _keyed(counts: dict[int, int]) -> dict[str, int]:
    return {str(version): count for version, count in sorted(counts.items())}


async def run_secrets(args: argparse.Namespace, settings: Settings) -> int:
    keyring = await run_sync(LocalKeyring.from_settings, settings, create=False)
    db = Database(settings.resolved_database_url)
    try:
        await check_schema(db)
        if args.secrets_command == "status":
            async with db.read() as conn:
                counts = await count_by_version(conn)
            print(json.dumps({"source": keyring.source, "versions": keyring.versions(), "current": keyring.current_version(),
                              "data_keys_by_version": _keyed(counts)}))
            return 0
        report = await rotate_master(db, keyring, settle_s=check_seconds(args.settle_s, "--settle-s"))
    finally:
        await db.dispose()
    print(json.dumps({**dataclasses.asdict(report), "data_keys_by_version": _keyed(report.data_keys_by_version)}))
    if report.unused_versions:
        print(f"cairn: master key version(s) {report.unused_versions} wrap no data key any more: remove them from "
              "CAIRN_MASTER_KEY on every process", file=sys.stderr)
    if report.unreadable:
        print(f"cairn: {len(report.unreadable)} data key(s) could not be re-wrapped (no master key opens them); "
              "their blobs were unreadable before the rotation too", file=sys.stderr)
        return 1
    return 0
