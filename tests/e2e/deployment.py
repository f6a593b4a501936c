"""A deployment of separate OS processes for the approval and ledger end-to-end tests: an API
server without workers (`--workers 0`), `cairn worker` processes started, killed, paused and
stopped by the test, an operator agents module loaded by all of them (`--agents`), and ways to
look at what they stored.

The agents module counts its tools' real executions in files outside any sandbox (its
docstring says which); the tests read them from here.
"""

from __future__ import annotations

import itertools
import json
import secrets
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from cairn.testing.server import CairnWorker
from tests.e2e.conftest import make_server, remove_server
from tests.waits import until_blocking

SESSIONS = "/agents/sessions"
APPROVAL_AGENTS = "approval_agents:registry"
E2E_DIR = Path(__file__).parent


class Deployment:
    """An API server without workers, workers started on demand, and the deploy counter."""

    def __init__(
        self, scripts_dir: Path, database_url: str | None, ttl_s: float = 3600, *, agents: str = APPROVAL_AGENTS,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.scripts_dir = scripts_dir
        self.database_url = database_url
        self.agents = agents
        root = Path(scripts_dir).parent
        self.deploys_path = root / f"deploys-{secrets.token_hex(4)}.log"
        self.env = {
            "PYTHONPATH": str(E2E_DIR),
            "CAIRN_TEST_DEPLOYS": str(self.deploys_path),
            "CAIRN_APPROVAL_TTL_S": str(ttl_s),
            "CAIRN_APPROVAL_EXPIRY_CHECK_S": "0.2",
            **(env or {}),
        }
        self.api = make_server(scripts_dir, database_url=database_url, env=self.env, extra_args=("--workers", "0", "--agents", agents))
        self.api.start()
        self.workers: list[CairnWorker] = []
        self._worker_names = itertools.count()
        self.keys = {"admin": self.api.admin_key}

    # -- processes ------------------------------------------------------------------------

    def worker(self, variant: str = "v1", *, env: Mapping[str, str] | None = None, slots: int = 2) -> CairnWorker:
        worker = CairnWorker(
            self.api.data_dir, name=f"worker{next(self._worker_names)}", scripts_dir=self.scripts_dir,
            database_url=self.database_url, env={**self.env, "CAIRN_TEST_AGENT_VARIANT": variant, **(env or {})},
            extra_args=("--workers", str(slots), "--agents", self.agents),
        )
        self.workers.append(worker)
        return worker.start()

    def stop_workers(self) -> None:
        for worker in self.workers:
            assert worker.stop() == 0, worker.log_since_start()
        self.workers.clear()

    def restart_api(self) -> None:
        self.api.stop()
        self.api.start()

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        remove_server(self.api)

    # -- keys and requests ----------------------------------------------------------------

    def key(self, role: str) -> str:
        if role not in self.keys:
            self.keys[role] = json.loads(self.cli("keys", "create", "--tenant", "default", "--role", role))["key"]
        return self.keys[role]

    def key_id(self, role: str) -> str:
        secret = self.key(role)
        for line in self.cli("keys", "list").splitlines():
            record = json.loads(line)
            if record["role"] == role and not record["revoked"]:
                return str(record["id"])
        raise AssertionError(f"no live {role} key ({secret[:12]}…)")

    def cli(self, *args: str, check: bool = True) -> str:
        argv = [sys.executable, "-m", "cairn.cli", *args, "--data-dir", str(self.api.data_dir)]
        if args[0] in ("keys", "secrets") and self.database_url is not None:
            argv += ["--database-url", self.database_url]
        if args[0] in ("approvals", "ledger"):
            argv += ["--base-url", self.api.base_url, "--api-key", self.key("approver")]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if check:
            assert done.returncode == 0, done.stderr
        return done.stdout if check else done.stderr

    def http(self, role: str = "admin") -> httpx.Client:
        return httpx.Client(base_url=self.api.base_url, headers={"Authorization": f"Bearer {self.key(role)}"}, timeout=30)

    def engine(self) -> sa.Engine:
        """A synchronous connection pool on the deployment's database, for looking behind Cairn's back."""
        url = self.database_url or f"sqlite:///{self.api.data_dir / 'cairn.db'}"
        return sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))

    def execute(self, sql: str, **params: object) -> None:
        """Change the database behind Cairn's back, as someone with write access to it could."""
        engine = self.engine()
        try:
            with engine.begin() as conn:
                conn.execute(sa.text(sql), params)
        finally:
            engine.dispose()

    # -- what the tests look at -----------------------------------------------------------

    def deploys(self) -> list[str]:
        return self.deploys_path.read_text().splitlines() if self.deploys_path.exists() else []

    def start_session(self, agent_id: str, model: str) -> str:
        """A session of the agent whose first turn plays `model` (a `scripted:` one)."""
        with self.http() as http:
            response = http.post(SESSIONS, json={"agent_id": agent_id, "agent": {"model": model},
                                                 "environment": {"type": "none"}, "input": "ship it"})
            assert response.status_code == 200, response.text
            return str(response.json()["id"])

    def held(self, model: str = "scripted:approval_release") -> tuple[str, list[dict[str, Any]]]:
        """A session of the release agent whose turn waits for its approvals."""
        session_id = self.start_session("release-agent", model)
        session = self.wait_session(session_id, "requires_action")
        return session_id, session["required_actions"]

    def session(self, session_id: str) -> dict[str, Any]:
        with self.http() as http:
            return dict(http.get(f"{SESSIONS}/{session_id}").json())

    def wait_session(self, session_id: str, status: str, timeout_s: float = 60) -> dict[str, Any]:
        return until_blocking(
            lambda: (s := self.session(session_id))["status"] == status and s, f"session {session_id} to be {status}",
            timeout_s=timeout_s, interval_s=0.05, seen=lambda: self.session(session_id)["status"],
        )

    def approval(self, approval_id: str) -> dict[str, Any]:
        with self.http() as http:
            return dict(http.get(f"/approvals/{approval_id}").json())

    def approve(self, approval_id: str) -> None:
        self.cli("approvals", "approve", approval_id, "--digest", self.approval(approval_id)["arguments_digest"])

    def items(self, session_id: str) -> list[dict[str, Any]]:
        with self.http() as http:
            return list(http.get(f"{SESSIONS}/{session_id}/items", params={"limit": 100, "order": "asc"}).json()["data"])

    def call_item(self, session_id: str) -> dict[str, Any]:
        [item] = [i for i in self.items(session_id) if i["type"] == "mcp_call"]
        return item

    def turn_done(self, session_id: str) -> dict[str, Any]:
        """After the worker ran the rest of the turn: the session idle again."""
        return self.wait_session(session_id, "idle")
