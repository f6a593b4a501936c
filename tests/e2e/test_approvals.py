"""Human approval across separate OS processes (issue 15): the process that paused a call, the
approver and the worker that runs it are different processes, each restarted in between, on
one SQLite data dir, and once on PostgreSQL.

`approval_agents.deploy_release` needs approval and counts its executions in a file outside
any sandbox; the tests read that count from here. The API server runs no job (`--workers 0`);
turns run in `cairn worker` processes started and stopped by the tests.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from openai.lib.beta.agents._result import AgentTurnResultError

from cairn.testing.server import CairnWorker
from tests.e2e.conftest import DATABASES, database_url_for, make_server, remove_server
from tests.waits import until_blocking

SESSIONS = "/agents/sessions"
AGENTS = "approval_agents:registry"
E2E_DIR = Path(__file__).parent


class Approvals:
    """An API server without workers, workers started on demand, and the deploy counter."""

    def __init__(self, scripts_dir: Path, database_url: str | None, ttl_s: float = 3600) -> None:
        self.scripts_dir = scripts_dir
        self.database_url = database_url
        root = Path(scripts_dir).parent
        self.deploys_path = root / f"deploys-{secrets.token_hex(4)}.log"
        self.env = {
            "PYTHONPATH": str(E2E_DIR),
            "CAIRN_TEST_DEPLOYS": str(self.deploys_path),
            "CAIRN_APPROVAL_TTL_S": str(ttl_s),
            "CAIRN_APPROVAL_EXPIRY_CHECK_S": "0.2",
        }
        self.api = make_server(scripts_dir, database_url=database_url, env=self.env, extra_args=("--workers", "0", "--agents", AGENTS))
        self.api.start()
        self.workers: list[CairnWorker] = []
        self.keys = {"admin": self.api.admin_key}

    # -- processes ------------------------------------------------------------------------

    def worker(self, variant: str = "v1") -> CairnWorker:
        worker = CairnWorker(
            self.api.data_dir, name=f"worker{len(self.workers)}", scripts_dir=self.scripts_dir, database_url=self.database_url,
            env={**self.env, "CAIRN_TEST_AGENT_VARIANT": variant}, extra_args=("--workers", "2", "--agents", AGENTS),
        ).start()
        self.workers.append(worker)
        return worker

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
        if args[0] == "keys" and self.database_url is not None:
            argv += ["--database-url", self.database_url]
        if args[0] == "approvals":
            argv += ["--base-url", self.api.base_url, "--api-key", self.key("approver")]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if check:
            assert done.returncode == 0, done.stderr
        return done.stdout if check else done.stderr

    def http(self, role: str = "admin") -> httpx.Client:
        return httpx.Client(base_url=self.api.base_url, headers={"Authorization": f"Bearer {self.key(role)}"}, timeout=30)

    def execute(self, sql: str, **params: object) -> None:
        """Change the database behind Cairn's back, as someone with write access to it could."""
        url = self.database_url or f"sqlite:///{self.api.data_dir / 'cairn.db'}"
        engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        try:
            with engine.begin() as conn:
                conn.execute(sa.text(sql), params)
        finally:
            engine.dispose()

    # -- what the tests look at -----------------------------------------------------------

    def deploys(self) -> list[str]:
        return self.deploys_path.read_text().splitlines() if self.deploys_path.exists() else []

    def held(self, model: str = "scripted:approval_release") -> tuple[str, list[dict[str, Any]]]:
        """A session of the release agent whose turn waits for its approvals."""
        with self.http() as http:
            response = http.post(SESSIONS, json={"agent_id": "release-agent", "agent": {"model": model},
                                                 "environment": {"type": "none"}, "input": "ship it"})
            assert response.status_code == 200, response.text
            session_id = response.json()["id"]
        session = self.wait_session(session_id, "requires_action")
        return session_id, session["required_actions"]

    def session(self, session_id: str) -> dict[str, Any]:
        with self.http() as http:
            return dict(http.get(f"{SESSIONS}/{session_id}").json())

    def wait_session(self, session_id: str, status: str) -> dict[str, Any]:
        return until_blocking(
            lambda: (s := self.session(session_id))["status"] == status and s, f"session {session_id} to be {status}",
            timeout_s=60, interval_s=0.05, seen=lambda: self.session(session_id)["status"],
        )

    def approval(self, approval_id: str) -> dict[str, Any]:
        with self.http() as http:
            return dict(http.get(f"/approvals/{approval_id}").json())

    def items(self, session_id: str) -> list[dict[str, Any]]:
        with self.http() as http:
            return list(http.get(f"{SESSIONS}/{session_id}/items", params={"limit": 100, "order": "asc"}).json()["data"])

    def call_item(self, session_id: str) -> dict[str, Any]:
        [item] = [i for i in self.items(session_id) if i["type"] == "mcp_call"]
        return item

    def turn_done(self, session_id: str) -> dict[str, Any]:
        """After the worker ran the rest of the turn: the session idle again."""
        return self.wait_session(session_id, "idle")


@pytest.fixture(params=DATABASES)
def deployment(request: pytest.FixtureRequest, scripts_dir: Path) -> Iterator[Approvals]:
    instance = Approvals(scripts_dir, database_url_for(request, request.param, "approvals"))
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def sqlite_deployment(scripts_dir: Path) -> Iterator[Approvals]:
    instance = Approvals(scripts_dir, None)
    try:
        yield instance
    finally:
        instance.close()


def test_paused_approved_by_another_process_and_run_once_by_a_third_every_process_restarted(deployment: Approvals) -> None:
    worker = deployment.worker()
    session_id, [action] = deployment.held()
    assert action["type"] == "mcp_approval_request" and action["request"]["name"] == "deploy_release"
    assert action["request"]["server_label"] == "release-agent" and action["request"]["arguments"] == {"release": "r-42"}
    item = deployment.call_item(session_id)
    assert (item["status"], item["name"], item["server_label"]) == ("in_progress", "deploy_release", "release-agent")
    # Paused: nothing ran, and the pausing worker can exit (it holds nothing).
    assert deployment.deploys() == []
    assert worker.stop() == 0
    deployment.workers.clear()
    deployment.restart_api()

    # The approver, another process: the CLI shows the digest and approves exactly that.
    shown = json.loads(deployment.cli("approvals", "show", action["request_id"]))
    assert shown["status"] == "pending" and "run_state" not in shown
    decided = json.loads(deployment.cli("approvals", "approve", action["request_id"], "--digest", shown["arguments_digest"]))
    assert decided["status"] == "approved" and decided["decided_by"]["role"] == "approver"
    assert deployment.deploys() == []
    deployment.restart_api()

    deployment.worker()
    deployment.turn_done(session_id)
    assert deployment.deploys() == [f"r-42 {action['request_id']}"]
    item = deployment.call_item(session_id)
    assert (item["status"], item["output"], item["error"]) == ("completed", "deployed:r-42", None)
    assert deployment.approval(action["request_id"])["started_at"] is not None
    # A second decision now is refused, and nothing runs again.
    assert "409" in deployment.cli("approvals", "reject", action["request_id"], check=False)
    assert deployment.deploys() == [f"r-42 {action['request_id']}"]


def test_the_official_clients_stream_ends_with_the_approval_request(sqlite_deployment: Approvals) -> None:
    deployment = sqlite_deployment
    deployment.worker()
    with deployment.api.client() as client:
        session = client.beta.agents.sessions.create(
            agent_id="release-agent", agent={"model": "scripted:approval_release"}, environment={"type": "openai_hosted"}
        )
        with client.beta.agents.sessions.stream(session.id, input="ship it") as stream, pytest.raises(AgentTurnResultError) as ended:
            stream.get_final_result()
        assert ended.value.reason == "requires_action"
        [action] = ended.value.required_actions
        assert action.type == "mcp_approval_request" and action.request.name == "deploy_release"
        assert deployment.deploys() == []
        # The same client approves through the Agents API input event, with an approver key.
    with deployment.api.client(api_key=deployment.key("approver")) as approver:
        approver.beta.agents.sessions.events.create(session.id, events=[{
            "type": "agent.session.input.mcp_approval_request_result", "request_id": action.request_id,
            "response": {"type": "mcp_tool_call", "decision": "approve"},
        }])
    deployment.turn_done(session.id)
    assert deployment.deploys() == [f"r-42 {action.request_id}"]


def test_a_rejection_runs_nothing_and_the_model_is_told_why(sqlite_deployment: Approvals) -> None:
    deployment = sqlite_deployment
    deployment.worker()
    session_id, [action] = deployment.held()
    with deployment.http() as http:
        message = {"type": "agent.session.input.message", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hurry"}]}]}
        busy = http.post(f"{SESSIONS}/{session_id}/events", json={"events": [message]})
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "awaiting_approval"
    deployment.cli("approvals", "reject", action["request_id"], "--message", "not on a Friday")
    deployment.turn_done(session_id)
    assert deployment.deploys() == []
    item = deployment.call_item(session_id)
    assert item["status"] == "failed" and "not on a Friday" in item["error"]
    # The model's next request is built from this item: its result is the rejection text.
    messages = [i for i in deployment.items(session_id) if i["type"] == "message" and i["role"] == "assistant"]
    assert messages[-1]["content"][0]["text"] == "released"


def test_two_decisions_at_once_one_wins_the_other_is_409(sqlite_deployment: Approvals) -> None:
    deployment = sqlite_deployment
    session_id, [action] = (deployment.worker(), deployment.held())[1]
    digest = deployment.approval(action["request_id"])["arguments_digest"]
    statuses: list[int] = []
    start = threading.Barrier(2)

    def send(verb: str, body: dict[str, str]) -> None:
        with deployment.http("approver") as http:
            start.wait()
            statuses.append(http.post(f"/approvals/{action['request_id']}/{verb}", json=body).status_code)

    threads = [threading.Thread(target=send, args=("approve", {"arguments_digest": digest})),
               threading.Thread(target=send, args=("reject", {"message": "no"}))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(statuses) == [200, 409]
    deployment.turn_done(session_id)
    approved = deployment.approval(action["request_id"])["status"] == "approved"
    assert len(deployment.deploys()) == (1 if approved else 0)


def test_an_approval_nobody_decides_expires_and_runs_nothing(scripts_dir: Path) -> None:
    deployment = Approvals(scripts_dir, None, ttl_s=1)
    try:
        deployment.worker()
        session_id, [action] = deployment.held()
        deployment.turn_done(session_id)
        approval = deployment.approval(action["request_id"])
        assert (approval["status"], approval["reason"]) == ("expired", "expired")
        assert deployment.deploys() == [] and "expired" in deployment.call_item(session_id)["error"]
        assert "409" in deployment.cli("approvals", "approve", action["request_id"], "--digest", approval["arguments_digest"], check=False)
    finally:
        deployment.close()


_OUTCOMES = {
    "revoked": ("revoked", "revoked"),
    "key_revoked": ("invalidated", "approver_lost_rights"),
    "role_removed": ("invalidated", "approver_lost_rights"),
    "digest": ("invalidated", "digest_mismatch"),
    "arguments": ("invalidated", "digest_mismatch"),
    "run_state": ("invalidated", "run_state_mismatch"),
    "changed": ("invalidated", "migration_required"),
    "removed": ("invalidated", "migration_required"),
}


@pytest.mark.parametrize("change", sorted(_OUTCOMES))
def test_an_approved_call_that_no_longer_holds_at_execution_runs_nothing(sqlite_deployment: Approvals, change: str) -> None:
    deployment = sqlite_deployment
    deployment.worker()
    session_id, [action] = deployment.held()
    deployment.stop_workers()
    request_id = action["request_id"]
    approval = deployment.approval(request_id)
    deployment.cli("approvals", "approve", request_id, "--digest", approval["arguments_digest"])
    variant = "v1"
    if change == "revoked":
        deployment.cli("approvals", "revoke", request_id, "--reason", "change freeze")
    elif change == "key_revoked":
        deployment.cli("keys", "revoke", deployment.key_id("approver"))
    elif change == "role_removed":
        deployment.cli("keys", "set-role", deployment.key_id("approver"), "member")
    elif change == "digest":
        deployment.execute("UPDATE approvals SET arguments_digest = :d WHERE id = :i", d="0" * 64, i=request_id)
    elif change == "arguments":
        item = deployment.call_item(session_id)
        data = {k: v for k, v in item.items() if k not in ("id", "type", "status", "turn_id")}
        deployment.execute("UPDATE items SET data = :d WHERE id = :i", i=item["id"], d=json.dumps({**data, "arguments": '{"release": "r-666"}'}))
    elif change == "run_state":
        deployment.execute("UPDATE approvals SET run_state = :r WHERE id = :i", i=request_id,
                           r=json.dumps({"turn_id": action["turn_id"], "call_id": "call_forged"}))
    else:
        variant = change
    deployment.worker(variant)
    deployment.turn_done(session_id)
    assert deployment.deploys() == []
    ended = deployment.approval(request_id)
    assert (ended["status"], ended["reason"]) == _OUTCOMES[change]
    assert deployment.call_item(session_id)["error"]


def test_three_calls_of_one_step_decided_one_at_a_time(sqlite_deployment: Approvals) -> None:
    deployment = sqlite_deployment
    deployment.worker()
    session_id, actions = deployment.held("scripted:approval_release_three")
    assert [a["request"]["arguments"] for a in actions] == [{"release": "r-1"}, {"release": "r-2"}, {"release": "r-3"}]
    first, second, third = (a["request_id"] for a in actions)

    def approve(request_id: str) -> None:
        deployment.cli("approvals", "approve", request_id, "--digest", deployment.approval(request_id)["arguments_digest"])

    approve(second)
    until_blocking(lambda: len(deployment.deploys()) == 1, "the approved second call to run", timeout_s=60)
    waiting = deployment.wait_session(session_id, "requires_action")
    assert [a["request_id"] for a in waiting["required_actions"]] == [first, third]
    deployment.cli("approvals", "reject", third, "--message", "not r-3")
    until_blocking(lambda: [a["request_id"] for a in deployment.session(session_id)["required_actions"]] == [first],
                   "the turn to wait for the first call alone", timeout_s=60)
    approve(first)
    deployment.turn_done(session_id)
    assert [line.split()[0] for line in deployment.deploys()] == ["r-2", "r-1"]


def test_unknown_and_other_tenants_approvals_are_404_and_bad_decisions_change_nothing(sqlite_deployment: Approvals) -> None:
    deployment = sqlite_deployment
    deployment.worker()
    session_id, [action] = deployment.held()
    other = json.loads(deployment.cli("keys", "create", "--tenant", "other", "--role", "approver"))["key"]
    before = deployment.approval(action["request_id"])
    with httpx.Client(base_url=deployment.api.base_url, headers={"Authorization": f"Bearer {other}"}) as foreign:
        assert foreign.get(f"/approvals/{action['request_id']}").status_code == 404
        assert foreign.post(f"/approvals/{action['request_id']}/reject", json={}).status_code == 404
    with deployment.http("approver") as http:
        assert http.get("/approvals/apr_unknown").status_code == 404
        assert http.post(f"/approvals/{action['request_id']}/approve", json={"arguments_digest": 7}).status_code == 400
        assert http.post(f"/approvals/{action['request_id']}/approve", json={"arguments_digest": "0" * 64}).status_code == 409
    with deployment.http("member") as http:
        assert http.post(f"/approvals/{action['request_id']}/reject", json={}).status_code == 403
    assert deployment.approval(action["request_id"]) == before
    assert deployment.deploys() == []
