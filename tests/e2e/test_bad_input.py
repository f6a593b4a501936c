"""Bad input on every endpoint: the error envelope, the right status, and nothing changed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cairn.testing.server import CairnServer

SESSIONS = "/agents/sessions"
MESSAGE = {"type": "agent.session.input.message", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}


@pytest.fixture(scope="module")
def http(server: CairnServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.admin_key}"}, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def session_id(http: httpx.Client) -> str:
    response = http.post(SESSIONS, json={"agent": {"model": "scripted:echo"}, "environment": {"type": "openai_hosted"}})
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


def _snapshot(http: httpx.Client, session_id: str) -> dict[str, Any]:
    """Everything a client can observe about a session."""
    return {
        "session": {k: v for k, v in http.get(f"{SESSIONS}/{session_id}").json().items() if k != "last_active_at"},
        "items": http.get(f"{SESSIONS}/{session_id}/items").json()["data"],
        "turns": http.get(f"{SESSIONS}/{session_id}/turns").json()["data"],
        "artifacts": http.get(f"{SESSIONS}/{session_id}/artifacts").json()["data"],
        "sessions": len(http.get(SESSIONS, params={"limit": 100}).json()["data"]),
    }


def _assert_error(response: httpx.Response, status: int, *, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    assert response.headers.get("x-request-id", "").startswith("req_")
    return dict(error)


BAD_REQUESTS: list[tuple[str, str, str, Any, int]] = [
    # (name, method, path suffix, body, status)
    ("malformed json", "POST", "", b"{not json", 400),
    ("json array", "POST", "", [1, 2], 400),
    ("empty body", "POST", "", b"", 400),
    ("missing environment", "POST", "", {"agent": {"model": "scripted:echo"}}, 400),
    ("missing agent", "POST", "", {"environment": {"type": "openai_hosted"}}, 400),
    ("wrong type for model", "POST", "", {"agent": {"model": 5}, "environment": {"type": "openai_hosted"}}, 400),
    ("unknown field", "POST", "", {"agent": {"model": "scripted:echo"}, "environment": {"type": "openai_hosted"}, "colour": "red"}, 400),
    ("unknown environment type", "POST", "", {"agent": {"model": "scripted:echo"}, "environment": {"type": "mars"}}, 400),
    ("self-hosted environment", "POST", "", {"agent": {"model": "scripted:echo"}, "environment": {"type": "self_hosted", "workspace_directory": "/"}}, 400),
    ("unknown script", "POST", "", {"agent": {"model": "scripted:nope"}, "environment": {"type": "openai_hosted"}}, 400),
    ("unknown provider", "POST", "", {"agent": {"model": "acme:big"}, "environment": {"type": "openai_hosted"}}, 400),
    ("script path traversal", "POST", "", {"agent": {"model": "scripted:../../etc/passwd"}, "environment": {"type": "openai_hosted"}}, 400),
    ("tool name clash", "POST", "", {"agent": {"model": "scripted:echo", "tools": [{"type": "function", "name": "shell"}]}, "environment": {"type": "openai_hosted"}}, 400),
    ("unsupported tool", "POST", "", {"agent": {"model": "scripted:echo", "tools": [{"type": "web_search"}]}, "environment": {"type": "openai_hosted"}}, 400),
    ("too much metadata", "POST", "", {"agent": {"model": "scripted:echo"}, "environment": {"type": "openai_hosted"}, "metadata": {str(i): "v" for i in range(17)}}, 400),
    ("bad base64 file", "POST", "", {"agent": {"model": "scripted:echo"}, "environment": {"type": "openai_hosted", "files": [{"type": "inline", "data": "!!", "path": "/workspace/a"}]}}, 400),
    ("file outside workspace", "POST", "", {"agent": {"model": "scripted:echo"}, "environment": {"type": "openai_hosted", "files": [{"type": "inline", "data": "aGk=", "path": "/etc/x"}]}}, 400),
    ("bad list limit", "GET", "?limit=0", None, 400),
    ("non-numeric limit", "GET", "?limit=ten", None, 400),
    ("bad order", "GET", "?order=sideways", None, 400),
    ("unknown cursor", "GET", "?after=sess_missing", None, 400),
    ("unknown list parameter", "GET", "?colour=red", None, 400),
]


@pytest.mark.parametrize(("name", "method", "suffix", "body", "status"), BAD_REQUESTS, ids=[r[0] for r in BAD_REQUESTS])
def test_bad_session_requests_change_nothing(
    http: httpx.Client, session_id: str, name: str, method: str, suffix: str, body: Any, status: int
) -> None:
    before = _snapshot(http, session_id)
    content = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else None
    response = http.request(method, SESSIONS + suffix, content=content, headers={"Content-Type": "application/json"})
    _assert_error(response, status)
    assert _snapshot(http, session_id) == before


BAD_EVENTS: list[tuple[str, Any, int, str | None]] = [
    ("malformed json", b'{"events": [', 400, None),
    ("events missing", {}, 400, None),
    ("events empty", {"events": []}, 400, None),
    ("unknown event type", {"events": [{"type": "agent.session.input.dance"}]}, 400, None),
    ("message without input", {"events": [{"type": "agent.session.input.message"}]}, 400, None),
    ("message with empty input", {"events": [{"type": "agent.session.input.message", "input": []}]}, 400, None),
    ("wrong content type", {"events": [{"type": "agent.session.input.message", "input": [{"role": "user", "content": "hi"}]}]}, 400, None),
    ("assistant role", {"events": [{"type": "agent.session.input.message", "input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]}]}, 400, None),
    ("tool result for no call", {"events": [{"type": "agent.session.input.tool_result", "turn_id": "turn_x", "call_id": "call_x", "success": True}]}, 400, "invalid_request_error"),
    ("tool result wrong types", {"events": [{"type": "agent.session.input.tool_result", "turn_id": 1, "call_id": [], "success": "yes"}]}, 400, None),
    ("valid message then a bad event", {"events": [MESSAGE, {"type": "agent.session.input.tool_result", "turn_id": "t", "call_id": "c", "success": True}]}, 400, "invalid_request_error"),
]


@pytest.mark.parametrize(("name", "body", "status", "code"), BAD_EVENTS, ids=[r[0] for r in BAD_EVENTS])
def test_bad_input_events_change_nothing(
    http: httpx.Client, session_id: str, name: str, body: Any, status: int, code: str | None
) -> None:
    before = _snapshot(http, session_id)
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = http.post(f"{SESSIONS}/{session_id}/events", content=content, headers={"Content-Type": "application/json"})
    _assert_error(response, status, code=code)
    assert _snapshot(http, session_id) == before


def test_oversized_bodies_are_refused(http: httpx.Client, session_id: str) -> None:
    before = _snapshot(http, session_id)
    huge = "x" * (9 * 1024 * 1024)
    message = {"events": [{"type": "agent.session.input.message", "input": [{"role": "user", "content": [{"type": "input_text", "text": huge}]}]}]}
    _assert_error(http.post(f"{SESSIONS}/{session_id}/events", json=message), 413)
    _assert_error(http.post(SESSIONS, json={"agent": {"model": "scripted:echo", "instructions": huge}, "environment": {"type": "openai_hosted"}}), 413)
    assert _snapshot(http, session_id) == before


UNKNOWN_IDS = [
    ("GET", f"{SESSIONS}/sess_missing"),
    ("POST", f"{SESSIONS}/sess_missing"),
    ("DELETE", f"{SESSIONS}/sess_missing"),
    ("GET", f"{SESSIONS}/sess_missing/items"),
    ("GET", f"{SESSIONS}/sess_missing/turns"),
    ("GET", f"{SESSIONS}/sess_missing/artifacts"),
    ("GET", f"{SESSIONS}/sess_missing/events"),
    ("POST", f"{SESSIONS}/sess_missing/events"),
    ("GET", f"{SESSIONS}/{{sid}}/turns/turn_missing"),
    ("GET", f"{SESSIONS}/{{sid}}/turns/turn_missing/items"),
    ("GET", f"{SESSIONS}/{{sid}}/artifacts/art_missing"),
    ("GET", f"{SESSIONS}/{{sid}}/artifacts/art_missing/content"),
    ("DELETE", f"{SESSIONS}/{{sid}}/artifacts/art_missing"),
]


@pytest.mark.parametrize(("method", "path"), UNKNOWN_IDS)
def test_unknown_ids_are_404(http: httpx.Client, session_id: str, method: str, path: str) -> None:
    body = {"events": [MESSAGE]} if path.endswith("/events") and method == "POST" else {} if method == "POST" else None
    response = http.request(method, path.format(sid=session_id), json=body)
    _assert_error(response, 404)


def test_unknown_routes_and_methods(http: httpx.Client) -> None:
    _assert_error(http.get("/agents/nothing-here"), 404)
    _assert_error(http.put(SESSIONS), 405)


def test_authentication_is_required(server: CairnServer, session_id: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}):
        response = httpx.get(f"{server.base_url}{SESSIONS}/{session_id}", headers=headers)
        _assert_error(response, 401)


def _cli(server: CairnServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cairn.cli", "keys", *args, "--data-dir", str(server.data_dir)],
        capture_output=True, text=True, check=False,
    )


def test_other_tenants_see_404_and_readers_cannot_write(server: CairnServer, http: httpx.Client, session_id: str) -> None:
    created = _cli(server, "create", "--tenant", "other", "--role", "member")
    assert created.returncode == 0, created.stderr
    other_key = json.loads(created.stdout)["key"]
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {other_key}"}) as other:
        for method, path in [("GET", ""), ("GET", "/items"), ("POST", "/events"), ("DELETE", "")]:
            body = {"events": [MESSAGE]} if path == "/events" else None
            _assert_error(other.request(method, f"{SESSIONS}/{session_id}{path}", json=body), 404)
        assert session_id not in {s["id"] for s in other.get(SESSIONS).json()["data"]}
    reader = json.loads(_cli(server, "create", "--tenant", "default", "--role", "reader").stdout)["key"]
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {reader}"}) as read_only:
        assert read_only.get(f"{SESSIONS}/{session_id}").status_code == 200
        _assert_error(read_only.post(f"{SESSIONS}/{session_id}/events", json={"events": [MESSAGE]}), 403)
    bad_role = _cli(server, "create", "--tenant", "x", "--role", "god")
    assert bad_role.returncode != 0 and "god" in bad_role.stderr
    assert http.get(f"{SESSIONS}/{session_id}").json()["status"] == "idle"
