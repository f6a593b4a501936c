"""Workspaces survive idleness and restarts: suspended to a snapshot, restored on the next turn."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from cairn.testing.server import CairnServer
from tests.e2e.conftest import make_server, remove_server
from tests.e2e.test_turn_control import SESSIONS, EventTail, _message


def _list_snapshots(server: CairnServer, session_id: str) -> str:
    argv = [sys.executable, "-m", "cairn.cli", "snapshots", "--data-dir", str(server.data_dir), "list", session_id]
    result = subprocess.run(argv, capture_output=True, text=True, check=True)
    return result.stdout + result.stderr


def _commands(http: httpx.Client, session_id: str) -> list[dict[str, Any]]:
    items = http.get(f"{SESSIONS}/{session_id}/items", params={"order": "asc", "limit": 100}).json()["data"]
    return [i for i in items if i["type"] == "command_execution"]


def test_idle_sessions_are_suspended_and_restored_even_after_losing_the_workspace(scripts_dir: Path) -> None:
    server = make_server(scripts_dir, env={"CAIRN_IDLE_STOP_S": "1"}).start()
    try:
        with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.admin_key}"}, timeout=30) as http:
            created = http.post(SESSIONS, json={"agent": {"model": "scripted:files"}, "environment": {"type": "openai_hosted"}, "input": "write"})
            session_id = created.json()["id"]
            tail = EventTail(server, session_id)
            suspended = tail.until(lambda e: e["type"] == "agent.session.environment.suspended", timeout_s=30)
            assert suspended["environment"]["status"] == "suspended"
            snapshots = list((server.data_dir / "snapshots").rglob("*"))
            assert snapshots, "the suspension persisted a snapshot"

            # The next turn on the same host: the workspace is reused (skip by fingerprint).
            http.post(f"{SESSIONS}/{session_id}/events", json={"events": [_message("read")]})
            tail.until(lambda e: e["type"] == "agent.session.turn.completed")
            second = tail.events[tail.events.index(suspended) + 1 :]
            types = [e["type"] for e in second]
            assert "agent.session.environment.ready" in types
            assert types.index("agent.session.environment.ready") < types.index("agent.session.turn.item.added")
            assert _commands(http, session_id)[-1]["output"].splitlines() == ["hello", "hello", "d/empty"]
            tail.until(lambda e: e["type"] == "agent.session.environment.suspended", timeout_s=30)

            # A crash that also loses the workspace directory: the next turn restores it.
            server.kill()
            shutil.rmtree(server.data_dir / "workspaces" / session_id)
            server.start()
            http.post(f"{SESSIONS}/{session_id}/events", json={"events": [_message("again")]})
            restart = EventTail(server, session_id)
            restart.until(lambda e: e["type"] == "agent.session.turn.completed" and e["turn"]["status"] == "completed"
                          and len([x for x in restart.events if x["type"] == "agent.session.turn.completed"]) == 3)
            types = [e["type"] for e in restart.events]
            third = types[len(types) - 1 - types[::-1].index("agent.session.turn.created") :]
            assert third.index("agent.session.environment.pending") < third.index("agent.session.environment.ready")
            assert third.index("agent.session.environment.ready") < third.index("agent.session.turn.in_progress")
            assert _commands(http, session_id)[-1]["output"].strip() == "hello"

            # The CLI lists the session's snapshots; deleting the session deletes them.
            assert "has no snapshots" not in _list_snapshots(server, session_id)
            assert http.delete(f"{SESSIONS}/{session_id}").status_code == 200
            assert "has no snapshots" in _list_snapshots(server, session_id)
    finally:
        remove_server(server)
