"""`cairn approvals list|show|approve|reject|revoke`: deciding from a terminal.

The commands talk to a Cairn server over HTTP like any client (`--base-url`, `--api-key`;
or `CAIRN_BASE_URL`, `CAIRN_API_KEY`; by default the local server and the data dir's admin
key), so a decision made here follows exactly the rules of the REST API: the key's role,
the digest the approver was shown (`show` prints it; `approve` requires it), and one
decision per approval. Each prints the server's JSON; a refusal ends in its message and
exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import httpx

from cairn.config import Settings
from cairn.errors import CairnError

__all__ = ["add_approval_commands", "call_server", "client_options"]

_DEFAULT_BASE_URL = "http://127.0.0.1:8321/v1"


def client_options() -> argparse.ArgumentParser:
    """The options of a command that talks to a server (`--data-dir`, `--base-url`, `--api-key`),
    as a parent parser; `call_server` uses them."""
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--data-dir", default=os.environ.get("CAIRN_DATA_DIR", ".cairn"), help="whose admin key to use by default")
    client.add_argument("--base-url", default=os.environ.get("CAIRN_BASE_URL", _DEFAULT_BASE_URL), help="the server's API root")
    client.add_argument("--api-key", default=os.environ.get("CAIRN_API_KEY"), help="default: the data dir's admin key")
    return client


def add_approval_commands(sub: Any) -> None:
    """Add `approvals` and its subcommands to the `cairn` parser's subparsers `sub`."""
    client = client_options()
    approvals = sub.add_parser("approvals", parents=[client], help="list and decide tool calls waiting for approval")
    commands = approvals.add_subparsers(dest="approvals_command", required=True)
    listing = commands.add_parser("list", parents=[client], help="list approvals, newest first (JSON lines)")
    listing.add_argument("--status", default=None, help="pending, approved, rejected, expired, revoked or invalidated")
    listing.add_argument("--session-id", default=None)
    listing.add_argument("--tool-name", default=None)
    listing.add_argument("--limit", type=int, default=20)
    listing.set_defaults(run=_list)
    show = commands.add_parser("show", parents=[client], help="one approval: the review, the digest, the decision")
    show.add_argument("approval_id")
    show.set_defaults(run=_show)
    approve = commands.add_parser("approve", parents=[client], help="approve exactly the call you reviewed")
    approve.add_argument("approval_id")
    approve.add_argument("--digest", required=True, help="the arguments_digest `show` printed")
    approve.set_defaults(run=_approve)
    reject = commands.add_parser("reject", parents=[client], help="reject; the model is told your message")
    reject.add_argument("approval_id")
    reject.add_argument("--message", default=None)
    reject.set_defaults(run=_reject)
    revoke = commands.add_parser("revoke", parents=[client], help="revoke an approved call that has not started")
    revoke.add_argument("approval_id")
    revoke.add_argument("--reason", default=None)
    revoke.set_defaults(run=_revoke)


def _http(args: argparse.Namespace, settings: Settings) -> httpx.Client:
    key = args.api_key
    if key is None:
        path = Path(settings.admin_key_path)
        if not path.exists():
            raise CairnError(f"no --api-key given and no admin key at {path}", code="invalid_argument")
        key = path.read_text().strip()
    return httpx.Client(base_url=args.base_url.rstrip("/"), headers={"Authorization": f"Bearer {key}"}, timeout=30)


def call_server(args: argparse.Namespace, settings: Settings, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    """One request to the server `args` name; its JSON, or a `CairnError` with the refusal."""
    try:
        with _http(args, settings) as http:
            response = http.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise CairnError(f"cannot reach {args.base_url}: {exc}", code="unreachable") from exc
    body = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
    if response.is_error:
        message = (body.get("error") or {}).get("message") or response.text
        raise CairnError(f"{response.status_code}: {message}", code="request_refused")
    return dict(body)


def _list(args: argparse.Namespace, settings: Settings) -> None:
    params = {"limit": str(args.limit)}
    for name in ("status", "session_id", "tool_name"):
        if getattr(args, name) is not None:
            params[name] = getattr(args, name)
    for approval in call_server(args, settings, "GET", "/approvals", params=params)["data"]:
        print(json.dumps(approval))


def _show(args: argparse.Namespace, settings: Settings) -> None:
    print(json.dumps(call_server(args, settings, "GET", f"/approvals/{args.approval_id}"), indent=2))


def _decide(args: argparse.Namespace, settings: Settings, verb: str, body: dict[str, Any]) -> None:
    print(json.dumps(call_server(args, settings, "POST", f"/approvals/{args.approval_id}/{verb}", json=body)))


def _approve(args: argparse.Namespace, settings: Settings) -> None:
    _decide(args, settings, "approve", {"arguments_digest": args.digest})


def _reject(args: argparse.Namespace, settings: Settings) -> None:
    _decide(args, settings, "reject", {"message": args.message} if args.message is not None else {})


def _revoke(args: argparse.Namespace, settings: Settings) -> None:
    _decide(args, settings, "revoke", {"reason": args.reason} if args.reason is not None else {})
