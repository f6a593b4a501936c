"""The stream waits of the end-to-end tests fail, saying what they saw, when their event never comes."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest

from cairn.testing.server import CairnServer
from tests.e2e.streams import EventTail, read_turn, read_until


def _idle_session(server: CairnServer) -> str:
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.admin_key}"}) as http:
        response = http.post("/agents/sessions", json={"agent": {"model": "scripted:echo"}, "environment": {"type": "none"}, "input": "a"})
        assert response.status_code == 200, response.text
    session_id = str(response.json()["id"])
    EventTail(server, session_id).until(lambda e: e["type"] == "agent.session.idle")
    return session_id


def test_a_tail_waiting_for_an_event_that_never_comes_fails_at_its_deadline(server: CairnServer) -> None:
    tail = EventTail(server, _idle_session(server))
    with pytest.raises(AssertionError, match=r"no matching event in 1 s; saw \[.*'agent.session.idle'\]"):
        tail.until(lambda e: e["type"] == "agent.session.turn.failed", timeout_s=1)


def test_a_tail_on_a_stream_that_cannot_be_read_fails(server: CairnServer) -> None:
    session_id = _idle_session(server)
    with server.client() as client:
        client.beta.agents.sessions.delete(session_id)
    with pytest.raises(AssertionError, match="the event stream answered 404"):
        EventTail(server, session_id).until(lambda e: True)


def test_reading_a_stream_that_ends_first_fails() -> None:
    events = [SimpleNamespace(type=t) for t in ("agent.session.turn.created", "agent.session.turn.completed")]
    with pytest.raises(AssertionError, match=r"ended before the turn's idle; saw \['agent.session.turn.created', "):
        read_turn(events)
    with pytest.raises(AssertionError, match="ended before the session to require an action"):
        read_until(events, lambda event: event.type == "agent.session.requires_action", "the session to require an action")
    assert read_turn([*events, SimpleNamespace(type="agent.session.idle")])[-1].type == "agent.session.idle"
