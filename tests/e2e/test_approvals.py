"""Human approval across separate OS processes (issue 15): the process that paused a call, the
approver and the worker that runs it are different processes, each restarted in between, on
one SQLite data dir, and once on PostgreSQL.

`approval_agents.deploy_release` needs approval and counts its executions in a file outside
any sandbox; the tests read that count from here. The API server runs no job (`--workers 0`);
turns run in `cairn worker` processes started and stopped by the tests.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai.lib.beta.agents._result import AgentTurnResultError

from tests.e2e.conftest import DATABASES, database_url_for
from tests.e2e.deployment import SESSIONS
from tests.e2e.deployment import Deployment as Approvals
from tests.waits import until_blocking


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
    # The run state is sealed: a clear one written beside it is an alteration, never read.
    "run_state": ("invalidated", "state_deserialize_failure"),
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
