"""Run state sealed at rest, across separate OS processes (issue 17), on SQLite and PostgreSQL.

An approval's state is sealed for it (tenant, kind, approval id). Someone with write access to
the database changes it behind Cairn's back — one flipped byte, a truncated blob, two
approvals' blobs swapped, a blob moved from another tenant's approval with its data key row
rewritten to match — or a worker runs with another master key: the approved call is never
run (`deploy_release` counts its executions in a file outside Cairn), the approval says
`state_deserialize_failure`, the turn fails with that code, and another session goes on.
A master key rotation in another process while a worker runs leaves pending approvals
that resume and complete.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.e2e.conftest import DATABASES, database_url_for
from tests.e2e.deployment import SESSIONS, Deployment
from tests.e2e.streams import TERMINAL, EventTail
from tests.waits import until_blocking


@pytest.fixture(params=DATABASES)
def deployment(request: pytest.FixtureRequest, scripts_dir: Path) -> Iterator[Deployment]:
    instance = Deployment(scripts_dir, database_url_for(request, request.param, "sealed"))
    try:
        yield instance
    finally:
        instance.close()


def _sealed(deployment: Deployment, approval_id: str) -> bytes:
    engine = deployment.engine()
    try:
        with engine.connect() as conn:
            blob = conn.execute(sa.text("SELECT sealed_state FROM approvals WHERE id = :i"), {"i": approval_id}).scalar_one()
    finally:
        engine.dispose()
    assert isinstance(blob, bytes) and len(blob) > 45, "the approval's state is not stored sealed"
    return blob


def _store(deployment: Deployment, approval_id: str, blob: bytes) -> None:
    deployment.execute("UPDATE approvals SET sealed_state = :b WHERE id = :i", b=blob, i=approval_id)


def _flipped(blob: bytes) -> bytes:
    middle = len(blob) // 2  # inside the ciphertext, past the format, key id and nonce
    return blob[:middle] + bytes([blob[middle] ^ 0x01]) + blob[middle + 1:]


def _other_tenants_held(deployment: Deployment) -> str:
    """An approval held in tenant `other`: its request id."""
    admin = json.loads(deployment.cli("keys", "create", "--tenant", "other", "--role", "admin"))["key"]
    with httpx.Client(base_url=deployment.api.base_url, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as http:
        response = http.post(SESSIONS, json={"agent_id": "release-agent", "agent": {"model": "scripted:approval_release"},
                                             "environment": {"type": "none"}, "input": "ship it"})
        assert response.status_code == 200, response.text
        session_id = response.json()["id"]
        session = until_blocking(
            lambda: (s := http.get(f"{SESSIONS}/{session_id}").json())["status"] == "requires_action" and s,
            f"the other tenant's session {session_id} to wait for its approval", timeout_s=60, interval_s=0.05,
        )
    return str(session["required_actions"][0]["request_id"])


def _failed_turn(deployment: Deployment, session_id: str) -> dict[str, Any]:
    ended = EventTail(deployment.api, session_id).until(lambda e: e["type"] in TERMINAL)
    assert ended["type"] == "agent.session.turn.failed", ended
    return dict(ended["turn"]["error"])


@pytest.mark.parametrize("tamper", ["flipped_byte", "truncated", "swapped_approvals", "swapped_tenants", "wrong_master_key"])
def test_a_run_state_that_does_not_open_is_never_resumed_and_the_session_says_why(deployment: Deployment, tamper: str) -> None:
    deployment.worker()
    victim, [action] = deployment.held()
    bystander, [bystander_action] = deployment.held()
    donor = deployment.held()[1][0]["request_id"] if tamper == "swapped_approvals" else None
    foreign = _other_tenants_held(deployment) if tamper == "swapped_tenants" else None
    deployment.stop_workers()
    victim_id = action["request_id"]
    deployment.approve(victim_id)
    blob = _sealed(deployment, victim_id)
    env: dict[str, str] = {}
    if tamper == "flipped_byte":
        _store(deployment, victim_id, _flipped(blob))
    elif tamper == "truncated":
        _store(deployment, victim_id, blob[:-7])
    elif tamper == "swapped_approvals":
        assert donor is not None
        _store(deployment, victim_id, _sealed(deployment, donor))
        _store(deployment, donor, blob)
    elif tamper == "swapped_tenants":
        assert foreign is not None
        moved = _sealed(deployment, foreign)
        _store(deployment, victim_id, moved)
        # The data key row is rewritten to claim the victim too: only the cryptography is left.
        deployment.execute("UPDATE data_keys SET tenant = 'default', record_id = :v WHERE id = :k",
                           v=victim_id, k=moved[1:17].hex())
    else:
        env = {"CAIRN_MASTER_KEY": secrets.token_hex(32)}
    if not env:
        deployment.approve(bystander_action["request_id"])  # runs beside it, on the same worker
    deployment.worker(env=env)

    error = _failed_turn(deployment, victim)
    assert error["code"] == "state_deserialize_failure" and "approval" in error["message"], error
    deployment.turn_done(victim)
    assert not [line for line in deployment.deploys() if line.endswith(victim_id)]
    ended = deployment.approval(victim_id)
    assert (ended["status"], ended["reason"]) == ("invalidated", "state_deserialize_failure")
    # The approver sees it in the CLI too; the API shows nothing of a state that does not open.
    shown = json.loads(deployment.cli("approvals", "show", victim_id))
    assert (shown["status"], shown["reason"]) == ("invalidated", "state_deserialize_failure")
    if tamper != "wrong_master_key":
        assert (shown["state"], shown["review"], shown["summary"]) == ("unreadable", None, None)

    # Nothing else broke: the other session's approved call runs once, with the right key.
    if env:
        deployment.stop_workers()
        deployment.worker()
        deployment.approve(bystander_action["request_id"])
    deployment.turn_done(bystander)
    assert [line for line in deployment.deploys() if line.endswith(bystander_action["request_id"])] == [
        f"r-42 {bystander_action['request_id']}"
    ]
    assert len(deployment.deploys()) == 1


def test_rotating_the_master_key_in_another_process_while_a_worker_runs_keeps_pending_approvals(deployment: Deployment) -> None:
    deployment.worker()
    held = [deployment.held() for _ in range(2)]
    status = json.loads(deployment.cli("secrets", "status"))
    assert status["versions"] == [1] and status["data_keys_by_version"]["1"] >= 2

    rotated = json.loads(deployment.cli("secrets", "rotate-master"))
    assert (rotated["version"], rotated["dropped_versions"], rotated["unreadable"]) == (2, [1], [])
    assert rotated["rewrapped"] >= 2 and set(rotated["data_keys_by_version"]) == {"2"}
    key_file = (deployment.api.data_dir / "master.key").read_text()
    assert [line.split()[0] for line in key_file.splitlines() if not line.startswith("#")] == ["2"]

    # The worker that ran all along opens them with the new version, and each runs once.
    for _, [action] in held:
        shown = deployment.approval(action["request_id"])
        assert (shown["state"], shown["review"]) == ("sealed", {"release": "r-42"})
        deployment.approve(action["request_id"])
    for session_id, _ in held:
        deployment.turn_done(session_id)
    assert sorted(deployment.deploys()) == sorted(f"r-42 {action['request_id']}" for _, [action] in held)
