"""Cancel, delete while running, queued input, idempotent input, and recovery after SIGKILL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cairn.testing.server import CairnServer
from tests.e2e.conftest import make_server, remove_server
from tests.e2e.streams import EventTail

SESSIONS = "/agents/sessions"


def _message(text: str) -> dict[str, Any]:
    return {"type": "agent.session.input.message", "input": [{"role": "user", "content": [{"type": "input_text", "text": text}]}]}


def _start(http: httpx.Client, model: str, text: str) -> str:
    response = http.post(SESSIONS, json={"agent": {"model": model}, "environment": {"type": "openai_hosted"}, "input": text})
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


def _output_started(event: dict[str, Any]) -> bool:
    return event["type"] == "agent.output.command_execution_output.delta" and "started" in event["delta"]


@pytest.fixture(scope="module")
def http(server: CairnServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.admin_key}"}, timeout=30) as c:
        yield c


def test_cancel_stops_a_running_command_and_delete_waits_for_it(server: CairnServer, http: httpx.Client) -> None:
    session_id = _start(http, "scripted:slow", "sleep")
    tail = EventTail(server, session_id)
    tail.until(_output_started)

    busy = http.delete(f"{SESSIONS}/{session_id}")
    assert busy.status_code == 409
    assert busy.headers["x-should-retry"] == "false" and int(busy.headers["retry-after-ms"]) > 0
    assert busy.json()["error"]["code"] == "session_busy"

    started = time.monotonic()
    assert http.post(f"{SESSIONS}/{session_id}/events", json={"events": [{"type": "agent.session.input.cancel"}]}).status_code == 202
    tail.until(lambda e: e["type"] == "agent.session.idle")
    assert time.monotonic() - started < 10
    types = [e["type"] for e in tail.events]
    assert types.index("agent.session.turn.cancelled") < types.index("agent.session.idle")
    command = next(i for i in http.get(f"{SESSIONS}/{session_id}/items").json()["data"] if i["type"] == "command_execution")
    assert command["status"] == "incomplete" and "finished" not in command["output"]
    assert http.get(f"{SESSIONS}/{session_id}").json()["status"] == "idle"
    assert http.delete(f"{SESSIONS}/{session_id}").json() == {"id": session_id, "object": "agent.session.deleted", "deleted": True}


def test_input_during_a_turn_is_queued_for_the_next_turn(server: CairnServer, http: httpx.Client) -> None:
    session_id = _start(http, "scripted:slow", "first")
    tail = EventTail(server, session_id)
    tail.until(_output_started)
    assert http.post(f"{SESSIONS}/{session_id}/events", json={"events": [_message("second")]}).status_code == 202
    turns = http.get(f"{SESSIONS}/{session_id}/turns", params={"order": "asc"}).json()["data"]
    assert [t["status"] for t in turns] == ["in_progress", "queued"]
    http.post(f"{SESSIONS}/{session_id}/events", json={"events": [{"type": "agent.session.input.cancel"}]})
    tail.until(lambda e: e["type"] == "agent.session.idle")
    turns = http.get(f"{SESSIONS}/{session_id}/turns", params={"order": "asc"}).json()["data"]
    assert [t["status"] for t in turns] == ["cancelled", "completed"]
    texts = [c["text"] for i in http.get(f"{SESSIONS}/{session_id}/items", params={"order": "asc"}).json()["data"]
             if i["type"] == "message" for c in i["content"]]
    assert texts[-2:] == ["second", "second turn"]


def test_an_idempotency_key_starts_one_turn_however_often_it_is_sent(server: CairnServer, http: httpx.Client) -> None:
    session_id = http.post(SESSIONS, json={"agent": {"model": "scripted:echo"}, "environment": {"type": "none"}, "input": "a"}).json()["id"]
    EventTail(server, session_id).until(lambda e: e["type"] == "agent.session.idle")
    for _ in range(3):
        response = http.post(f"{SESSIONS}/{session_id}/events", json={"events": [_message("b")]}, headers={"Idempotency-Key": "k-1"})
        assert response.status_code == 202
    reused = http.post(f"{SESSIONS}/{session_id}/events", json={"events": [_message("c")]}, headers={"Idempotency-Key": "k-1"})
    assert reused.status_code == 400 and reused.json()["error"]["code"] == "idempotency_key_reused"
    tail = EventTail(server, session_id)
    tail.until(lambda e: e["type"] == "agent.session.turn.completed" and e["turn"]["status"] == "completed" and
               len([x for x in tail.events if x["type"] == "agent.session.turn.completed"]) == 2)
    assert len(http.get(f"{SESSIONS}/{session_id}/turns").json()["data"]) == 2


def test_a_server_killed_mid_turn_resumes_the_turn_after_restart(scripts_dir: Path) -> None:
    instance = make_server(scripts_dir, env={"CAIRN_LEASE_S": "2"}).start()
    try:
        with httpx.Client(base_url=instance.base_url, headers={"Authorization": f"Bearer {instance.admin_key}"}) as http:
            session_id = _start(http, "scripted:crash", "go")
            tail = EventTail(instance, session_id)
            tail.until(_output_started)  # before.txt is written: the command is in its sleep
            before_kill = list(tail.events)
            instance.kill()
            instance.start()
            replay = EventTail(instance, session_id)
            replay.until(lambda e: e["type"] == "agent.session.idle", timeout_s=90)
            # The log survived intact: the same events, then the rest, numbered without gaps.
            assert replay.events[: len(before_kill)] == before_kill
            assert [e["sequence_number"] for e in replay.events] == list(range(1, len(replay.events) + 1))
            turn = http.get(f"{SESSIONS}/{session_id}/turns").json()["data"][0]
            assert turn["status"] == "completed"
            commands = [i for i in http.get(f"{SESSIONS}/{session_id}/items", params={"order": "asc"}).json()["data"]
                        if i["type"] == "command_execution"]
            assert commands[0]["status"] == "incomplete" and "interrupted" in commands[0]["output"]
            assert commands[1]["exit_code"] == 0 and "before.txt" in commands[1]["output"] and "never.txt" not in commands[1]["output"]
            with instance.client() as client:
                messages = [m for m in client.beta.agents.sessions.items.list(session_id) if m.type == "message"]
            assert messages[0].content[0].text == "recovered"
    finally:
        remove_server(instance)


def test_a_graceful_shutdown_hands_the_turn_back_at_once(scripts_dir: Path) -> None:
    # A long lease: the turn resumes quickly only because the job was released, not expired;
    # no drain grace: the running command is not waited for.
    instance = make_server(scripts_dir, env={"CAIRN_LEASE_S": "300", "CAIRN_DRAIN_GRACE_S": "0"}).start()
    try:
        with httpx.Client(base_url=instance.base_url, headers={"Authorization": f"Bearer {instance.admin_key}"}) as http:
            session_id = _start(http, "scripted:crash", "go")
            EventTail(instance, session_id).until(
                lambda e: e["type"] == "agent.session.turn.item.added" and e["item"]["type"] == "command_execution"
            )
            started = time.monotonic()
            instance.stop()
            assert time.monotonic() - started < 15
            instance.start()
            EventTail(instance, session_id).until(lambda e: e["type"] == "agent.session.idle", timeout_s=60)
            assert http.get(f"{SESSIONS}/{session_id}/turns").json()["data"][0]["status"] == "completed"
    finally:
        remove_server(instance)


def test_a_huge_command_output_is_capped_alike_in_the_stream_and_the_item(server: CairnServer, http: httpx.Client) -> None:
    session_id = _start(http, "scripted:big_output", "print a lot")
    tail = EventTail(server, session_id)
    tail.until(lambda e: e["type"] == "agent.session.idle")
    streamed = "".join(e["delta"] for e in tail.events if e["type"] == "agent.output.command_execution_output.delta")
    command = next(i for i in http.get(f"{SESSIONS}/{session_id}/items").json()["data"] if i["type"] == "command_execution")
    assert command["exit_code"] == 0
    assert len(streamed) < 1_100_000 and "neither streamed nor stored" in streamed
    assert command["output"].startswith(streamed.rstrip("\n")[: 1024 * 1024]) and "3000006 characters in all" in command["output"]
