"""`cairn ledger list|show|resolve`: the idempotency ledger from a terminal (docs/ledger.md).

Like `cairn approvals`, the commands talk to a Cairn server over HTTP (`--base-url`,
`--api-key`; or `CAIRN_BASE_URL`, `CAIRN_API_KEY`; by default the local server and the data
dir's admin key), so resolving here follows exactly the REST API's rules: an `admin` or
`approver` key, an `uncertain` entry, one outcome. Each prints the server's JSON; a refusal
ends in its message and exit status 2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from cairn.approvals_cli import call_server, client_options
from cairn.config import Settings

__all__ = ["add_ledger_commands"]


def add_ledger_commands(sub: Any) -> None:
    """Add `ledger` and its subcommands to the `cairn` parser's subparsers `sub`."""
    client = client_options()
    ledger = sub.add_parser("ledger", parents=[client], help="side effects and their outcomes; resolve uncertain ones")
    commands = ledger.add_subparsers(dest="ledger_command", required=True)
    listing = commands.add_parser("list", parents=[client], help="list entries, newest first (JSON lines)")
    listing.add_argument(
        "--status", default=None, help="reserved, executing, succeeded, failed_retryable, failed_terminal or uncertain"
    )
    listing.add_argument("--limit", type=int, default=20)
    listing.set_defaults(run=_list)
    show = commands.add_parser("show", parents=[client], help="one entry: its status, result, error and reason")
    show.add_argument("operation_key")
    show.set_defaults(run=_show)
    resolve = commands.add_parser("resolve", parents=[client], help="say what became of an uncertain effect; the turn goes on")
    resolve.add_argument("operation_key")
    outcome = resolve.add_mutually_exclusive_group(required=True)
    outcome.add_argument("--succeeded", metavar="RESULT", help="it happened: the call's result, as the tool would have returned it")
    outcome.add_argument("--failed", metavar="MESSAGE", help="it did not happen: the call's error, as the model is told")
    resolve.set_defaults(run=_resolve)


def _list(args: argparse.Namespace, settings: Settings) -> None:
    params = {"limit": str(args.limit)}
    if args.status is not None:
        params["status"] = args.status
    for entry in call_server(args, settings, "GET", "/ledger", params=params)["data"]:
        print(json.dumps(entry))


def _show(args: argparse.Namespace, settings: Settings) -> None:
    print(json.dumps(call_server(args, settings, "GET", f"/ledger/{args.operation_key}"), indent=2))


def _resolve(args: argparse.Namespace, settings: Settings) -> None:
    body = {"succeeded": args.succeeded} if args.succeeded is not None else {"failed": args.failed}
    print(json.dumps(call_server(args, settings, "POST", f"/ledger/{args.operation_key}/resolve", json=body)))
