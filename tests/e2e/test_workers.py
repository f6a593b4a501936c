"""`cairn serve --workers 0` beside `cairn worker` processes on one database (issue 14).

The API process runs no job; two worker processes share the turns. On SQLite they share a
data dir; on PostgreSQL they share the database (and, being on one machine here, the data
dir for artifact content). A worker stopped with SIGTERM mid-turn ends its step and hands
the job back, and the other finishes the turn with no duplicated item or event.
"""

from __future__ import annotations

import base64
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from cairn.testing.server import CairnWorker
from tests.e2e.conftest import DATABASES, database_url_for, make_server, remove_server
from tests.e2e.streams import TERMINAL, EventTail
from tests.waits import until_blocking

SESSIONS = "/agents/sessions"
STEPS = 6


@pytest.fixture
def steps_script(scripts_dir: Path) -> str:
    """A turn of several short commands, so a worker can be stopped between two of them."""
    steps = [{"call": "shell", "arguments": {"command": f"echo step{i}; sleep 0.3"}} for i in range(STEPS)]
    (scripts_dir / "steps.json").write_text(json.dumps({"turns": [[*steps, {"say": "all steps done"}]]}))
    return "scripted:steps"


class Deployment:
    """An API server with no worker and two worker processes on one database."""

    def __init__(self, scripts_dir: Path, database_url: str | None, env: dict[str, str]) -> None:
        self.api = make_server(scripts_dir, database_url=database_url, env=env, extra_args=("--workers", "0")).start()
        self.workers = [
            CairnWorker(self.api.data_dir, name=f"worker{i}", scripts_dir=scripts_dir, database_url=database_url, env=env,
                        extra_args=("--workers", "2")).start()
            for i in range(2)
        ]
        self.database_url = database_url or f"sqlite:///{self.api.data_dir / 'cairn.db'}"
        self.http = httpx.Client(base_url=self.api.base_url, headers={"Authorization": f"Bearer {self.api.admin_key}"}, timeout=30)

    def close(self) -> None:
        self.http.close()
        for worker in self.workers:
            worker.stop()
        remove_server(self.api)

    def query(self, sql: str, **params: object) -> list[tuple[object, ...]]:
        engine = sa.create_engine(self.database_url.replace("postgresql://", "postgresql+psycopg://", 1))
        try:
            with engine.connect() as conn:
                return [tuple(row) for row in conn.execute(sa.text(sql), params)]
        finally:
            engine.dispose()

    def owners(self, session_id: str) -> list[str]:
        return [str(o) for (o,) in self.query("SELECT lease_owner FROM jobs WHERE session_id = :s", s=session_id)]


@pytest.fixture(params=DATABASES)
def deployment(request: pytest.FixtureRequest, scripts_dir: Path) -> Iterator[Deployment]:
    url = database_url_for(request, request.param, "workers")
    instance = Deployment(scripts_dir, url, env={"CAIRN_DRAIN_GRACE_S": "30"})
    try:
        yield instance
    finally:
        instance.close()


def _assert_clean_log(events: list[dict[str, object]]) -> None:
    """Sequence numbers without gap or repeat, and every item added exactly once."""
    assert [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))
    added = [e["item"]["id"] for e in events if e["type"] == "agent.session.turn.item.added"]  # type: ignore[index]
    assert len(added) == len(set(added)), added


def test_an_api_server_and_two_workers_run_twenty_sessions(deployment: Deployment) -> None:
    data = base64.b64encode(b"seed\n").decode()
    created = []
    for i in range(20):
        response = deployment.http.post(SESSIONS, json={
            "agent": {"model": "scripted:echo"},
            "environment": {"type": "openai_hosted", "files": [{"type": "inline", "data": data, "path": f"/workspace/in{i}.txt"}]},
            "input": f"session {i}",
        })
        assert response.status_code == 200, response.text
        created.append(response.json()["id"])
    for session_id in created:
        tail = EventTail(deployment.api, session_id)
        tail.until(lambda e: e["type"] in TERMINAL, timeout_s=120)
        assert tail.events[-1]["type"] == "agent.session.turn.completed", tail.events[-1]
        _assert_clean_log(tail.events)
    pids = {owner.split(":")[1] for session_id in created for owner in deployment.owners(session_id)}
    assert pids <= {str(w.pid) for w in deployment.workers} and len(pids) == 2, pids
    assert str(deployment.api.pid) not in pids


def test_a_worker_stopped_mid_turn_hands_it_to_the_other(deployment: Deployment, steps_script: str) -> None:
    response = deployment.http.post(SESSIONS, json={"agent": {"model": steps_script}, "environment": {"type": "openai_hosted"}, "input": "go"})
    assert response.status_code == 200, response.text
    session_id = response.json()["id"]
    tail = EventTail(deployment.api, session_id)
    tail.until(lambda e: e["type"] == "agent.session.turn.item.done" and e["item"]["type"] == "command_execution")
    [owner] = deployment.owners(session_id)
    first = next(w for w in deployment.workers if f":{w.pid}:" in owner)
    other = next(w for w in deployment.workers if w is not first)
    assert first.process is not None
    first.process.send_signal(signal.SIGTERM)
    assert first.process.wait(timeout=60) == 0, first.log_since_start()
    tail.until(lambda e: e["type"] in TERMINAL, timeout_s=120)
    assert tail.events[-1]["type"] == "agent.session.turn.completed", tail.events[-1]
    _assert_clean_log(tail.events)
    items = deployment.http.get(f"{SESSIONS}/{session_id}/items", params={"limit": 100, "order": "asc"}).json()["data"]
    commands = [i for i in items if i["type"] == "command_execution"]
    assert [c["output"].strip() for c in commands] == [f"step{i}" for i in range(STEPS)]
    assert all(c["status"] == "completed" for c in commands)
    # The stopped worker gave the job back before the turn ended; the other one finished it.
    [owner] = deployment.owners(session_id)
    assert f":{other.pid}:" in owner, owner
    assert "draining" in first.log_since_start()


def test_workspaces_are_made_and_removed_by_workers_not_the_api_server(deployment: Deployment) -> None:
    data = base64.b64encode(b"seed\n").decode()
    response = deployment.http.post(SESSIONS, json={
        "agent": {"model": "scripted:echo"},
        "environment": {"type": "openai_hosted", "files": [{"type": "inline", "data": data, "path": "/workspace/in.txt"}]},
    })
    assert response.status_code == 200, response.text
    session_id = response.json()["id"]
    workspace = deployment.api.data_dir / "workspaces" / session_id
    assert not workspace.exists()  # the API process holds no workspace
    sent = deployment.http.post(f"{SESSIONS}/{session_id}/events", json={"events": [
        {"type": "agent.session.input.message", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}
    ]})
    assert sent.status_code == 202, sent.text
    EventTail(deployment.api, session_id).until(lambda e: e["type"] in TERMINAL, timeout_s=120)
    assert (workspace / "in.txt").read_bytes() == b"seed\n"
    assert deployment.http.delete(f"{SESSIONS}/{session_id}").status_code == 200
    removal = "SELECT status FROM jobs WHERE session_id = :s AND kind = 'remove_workspace'"
    # The job ends after the files are gone: wait for it, then look at the files.
    until_blocking(lambda: deployment.query(removal, s=session_id) == [("done",)], "a worker to finish the removal job",
                   timeout_s=60, seen=lambda: deployment.query(removal, s=session_id))
    assert not workspace.exists()
