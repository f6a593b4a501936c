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
    *(
        (f"network: {name}", "POST", "", {"agent": {"model": "scripted:echo"}, "environment": {"type": "openai_hosted", "network": network}}, 400)
        for name, network in [
            ("wildcard inside a name", {"access": "restricted", "allowed_domains": ["api.*.example.com"]}),
            ("wildcard suffix", {"access": "restricted", "allowed_domains": ["example.*"]}),
            ("wildcard over a top-level domain", {"access": "restricted", "allowed_domains": ["*.com"]}),
            ("IPv6 literal", {"access": "restricted", "allowed_domains": ["[2001:db8::1]"]}),
            ("bare IPv6 literal", {"access": "restricted", "allowed_domains": ["2001:db8::1"]}),
            ("IPv4 literal", {"access": "restricted", "allowed_domains": ["203.0.113.7"]}),
            ("host with a port", {"access": "restricted", "allowed_domains": ["example.com:443"]}),
            ("url instead of a host", {"access": "restricted", "allowed_domains": ["https://example.com"]}),
            ("empty domain", {"access": "restricted", "allowed_domains": [""]}),
            ("label too long", {"access": "restricted", "allowed_domains": ["a" * 64 + ".com"]}),
            ("leading hyphen", {"access": "restricted", "allowed_domains": ["-bad.example.com"]}),
            ("not a list", {"access": "restricted", "allowed_domains": "example.com"}),
            ("restricted without domains", {"access": "restricted"}),
            ("restricted with an empty list", {"access": "restricted", "allowed_domains": []}),
            ("allowed domains with access enabled", {"access": "enabled", "allowed_domains": ["example.com"]}),
            ("domains with access disabled", {"access": "disabled", "blocked_domains": ["example.com"]}),
            ("malformed blocked domain", {"access": "enabled", "blocked_domains": ["exa mple.com"]}),
            ("unknown access", {"access": "partial"}),
        ]
    ),
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


# -- hostile input (issue 19): each of these was a 500, a silent acceptance, or worse ----------

AGENT = {"model": "scripted:echo"}
HOSTED = {"type": "openai_hosted"}


def _raw(body: dict[str, Any], **replace: str) -> bytes:
    """JSON with placeholders swapped for raw escapes json.dumps would never write (lone surrogates)."""
    text = json.dumps(body)
    for placeholder, escape in replace.items():
        text = text.replace(placeholder, escape)
    return text.encode()


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


SURROGATE = "\\ud800"
HOSTILE_CREATES: list[tuple[str, bytes, str | None]] = [
    ("surrogate in input", _raw({"agent": AGENT, "environment": HOSTED, "input": "xSURy"}, SUR=SURROGATE), "input"),
    ("surrogate in metadata value", _raw({"agent": AGENT, "environment": HOSTED, "metadata": {"k": "SUR"}}, SUR=SURROGATE), "metadata.k"),
    ("surrogate in metadata key", _raw({"agent": AGENT, "environment": HOSTED, "metadata": {"kSUR": "v"}}, SUR=SURROGATE), "metadata"),
    ("surrogate in instructions", _raw({"agent": {**AGENT, "instructions": "SUR"}, "environment": HOSTED}, SUR=SURROGATE), "agent.instructions"),
    (
        "surrogate in tool parameters",
        _raw({"agent": {**AGENT, "tools": [{"type": "function", "name": "f", "parameters": {"d": "SUR"}}]}, "environment": HOSTED}, SUR=SURROGATE),
        "agent.tools.0.parameters.d",
    ),
    ("surrogate in experimental", _raw({"agent": {**AGENT, "experimental": {"SUR": 1}}, "environment": HOSTED}, SUR=SURROGATE), "agent.experimental"),
    ("nested 10,000 deep", _raw({"agent": AGENT, "environment": HOSTED, "metadata": "DEEP"}, **{'"DEEP"': _nested(10_000)}), None),
    ("nested 65 deep in a schema", _raw({"agent": {**AGENT, "tools": [{"type": "function", "name": "f", "parameters": "DEEP"}]}, "environment": HOSTED}, **{'"DEEP"': _nested(65)}), None),
    ("NUL in model", json.dumps({"agent": {"model": "scripted:echo\u0000"}, "environment": HOSTED}).encode(), "agent.model"),
    ("control character in model", json.dumps({"agent": {"model": "scripted:\u001becho"}, "environment": HOSTED}).encode(), "agent.model"),
    ("NUL in metadata value", json.dumps({"agent": AGENT, "environment": HOSTED, "metadata": {"k": "a\u0000"}}).encode(), "metadata.k"),
    ("NUL in env value", json.dumps({"agent": AGENT, "environment": {**HOSTED, "env": {"A": "x\u0000"}}}).encode(), "environment.openai_hosted.env.A"),
    ("NaN", b'{"agent": {"model": "scripted:echo"}, "environment": {"type": "openai_hosted"}, "spend_control": {"limit": NaN}}', None),
    ("a number of 5,000 digits", b'{"agent": {"model": "scripted:echo"}, "environment": {"type": "openai_hosted"}, "spend_control": {"limit": ' + b"9" * 5000 + b"}}", None),
    ("inline file path of 300 characters", json.dumps({"agent": AGENT, "environment": {**HOSTED, "files": [{"type": "inline", "data": "aGk=", "path": "a" * 300}]}}).encode(), "environment.files[0].path"),
    ("inline file at outputs/", json.dumps({"agent": AGENT, "environment": {**HOSTED, "files": [{"type": "inline", "data": "aGk=", "path": "outputs/"}]}}).encode(), "environment.files[0].path"),
    ("inline file at /workspace/outputs", json.dumps({"agent": AGENT, "environment": {**HOSTED, "files": [{"type": "inline", "data": "aGk=", "path": "/workspace/outputs"}]}}).encode(), "environment.files[0].path"),
    ("inline file path with a newline", json.dumps({"agent": AGENT, "environment": {**HOSTED, "files": [{"type": "inline", "data": "aGk=", "path": "a\nb"}]}}).encode(), "environment.openai_hosted.files.0.path"),
    ("tools[].strict as a string", json.dumps({"agent": {**AGENT, "tools": [{"type": "function", "name": "f", "strict": "true"}]}, "environment": HOSTED}).encode(), None),
    ("tools[].strict as 1", json.dumps({"agent": {**AGENT, "tools": [{"type": "function", "name": "f", "strict": 1}]}, "environment": HOSTED}).encode(), None),
    ("multi_agent.enabled as a string", json.dumps({"agent": {**AGENT, "multi_agent": {"enabled": "false"}}, "environment": HOSTED}).encode(), "agent.multi_agent.enabled"),
    ("multi_agent.enabled as 0", json.dumps({"agent": {**AGENT, "multi_agent": {"enabled": 0}}, "environment": HOSTED}).encode(), "agent.multi_agent.enabled"),
    ("spend_control.limit as a string", json.dumps({"agent": AGENT, "environment": HOSTED, "spend_control": {"limit": "5"}}).encode(), "spend_control.limit"),
    ("spend_control.limit as true", json.dumps({"agent": AGENT, "environment": HOSTED, "spend_control": {"limit": True}}).encode(), "spend_control.limit"),
    ("stream as a string", json.dumps({"agent": AGENT, "environment": HOSTED, "input": "hi", "stream": "false"}).encode(), "stream"),
    ("stream as 0", json.dumps({"agent": AGENT, "environment": HOSTED, "input": "hi", "stream": 0}).encode(), "stream"),
]


@pytest.mark.parametrize(("name", "body", "param"), HOSTILE_CREATES, ids=[r[0] for r in HOSTILE_CREATES])
def test_hostile_creates_are_400_and_change_nothing(http: httpx.Client, session_id: str, name: str, body: bytes, param: str | None) -> None:
    before = _snapshot(http, session_id)
    response = http.post(SESSIONS, content=body, headers={"Content-Type": "application/json"})
    _assert_error(response, 400, param=param)
    assert _snapshot(http, session_id) == before


HOSTILE_UPDATES: list[tuple[str, bytes, str | None]] = [
    ("surrogate in metadata", _raw({"metadata": {"k": "SUR"}}, SUR=SURROGATE), "metadata.k"),
    ("NUL in model", json.dumps({"agent": {"model": "scripted:echo\u0000"}}).encode(), "agent.model"),
    ("nested 10,000 deep", _raw({"metadata": "DEEP"}, **{'"DEEP"': _nested(10_000)}), None),
    ("spend_control.limit as a string", json.dumps({"spend_control": {"limit": "5"}}).encode(), "spend_control.limit"),
]


@pytest.mark.parametrize(("name", "body", "param"), HOSTILE_UPDATES, ids=[r[0] for r in HOSTILE_UPDATES])
def test_hostile_updates_are_400_and_change_nothing(http: httpx.Client, session_id: str, name: str, body: bytes, param: str | None) -> None:
    before = _snapshot(http, session_id)
    response = http.post(f"{SESSIONS}/{session_id}", content=body, headers={"Content-Type": "application/json"})
    _assert_error(response, 400, param=param)
    assert _snapshot(http, session_id) == before


HOSTILE_EVENTS: list[tuple[str, bytes, str | None]] = [
    ("surrogate in a message", _raw({"events": [{**MESSAGE, "input": [{"role": "user", "content": [{"type": "input_text", "text": "SUR"}]}]}]}, SUR=SURROGATE), "events.0.input.0.content.0.text"),
    ("nested 10,000 deep", _raw({"events": "DEEP"}, **{'"DEEP"': _nested(10_000)}), None),
    ("control character in a call id", json.dumps({"events": [{"type": "agent.session.input.tool_result", "turn_id": "t", "call_id": "c\u0000", "success": True}]}).encode(), None),
]


@pytest.mark.parametrize(("name", "body", "param"), HOSTILE_EVENTS, ids=[r[0] for r in HOSTILE_EVENTS])
def test_hostile_input_events_are_400_and_change_nothing(http: httpx.Client, session_id: str, name: str, body: bytes, param: str | None) -> None:
    before = _snapshot(http, session_id)
    response = http.post(f"{SESSIONS}/{session_id}/events", content=body, headers={"Content-Type": "application/json"})
    _assert_error(response, 400, param=param)
    assert _snapshot(http, session_id) == before


@pytest.mark.parametrize("value", ["²", "①", "١", "1_0", "+1", " 1", "-1", "1" * 30])
def test_starting_after_takes_ascii_digits_only(http: httpx.Client, session_id: str, value: str) -> None:
    _assert_error(http.get(f"{SESSIONS}/{session_id}/events", params={"starting_after": value}), 400, param="starting_after")
    _assert_error(http.get(SESSIONS, params={"limit": value}), 400, param="limit")


@pytest.mark.parametrize("path", ["/{sid}", "/{sid}/items", "/{sid}/turns/turn_%00x", "/sess_%01x"])
def test_control_characters_in_ids_and_queries_are_400(http: httpx.Client, session_id: str, path: str) -> None:
    _assert_error(http.get(SESSIONS + path.format(sid=session_id) + "?after=a%00b"), 400)


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml",
     "application/json; charset=latin-1", "application/jsonx"],
)
def test_json_bodies_need_the_json_content_type(http: httpx.Client, session_id: str, content_type: str | None) -> None:
    before = _snapshot(http, session_id)
    headers = {"Content-Type": content_type} if content_type else {}
    create = json.dumps({"agent": AGENT, "environment": HOSTED}).encode()
    events = json.dumps({"events": [MESSAGE]}).encode()
    for path, body in ((SESSIONS, create), (f"{SESSIONS}/{session_id}", b'{"metadata": {}}'), (f"{SESSIONS}/{session_id}/events", events)):
        _assert_error(http.post(path, content=body, headers=headers), 415)
    assert _snapshot(http, session_id) == before


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON; charset=\"UTF-8\""])
def test_the_json_content_type_may_name_utf8(http: httpx.Client, content_type: str) -> None:
    body = json.dumps({"agent": AGENT, "environment": {"type": "none"}, "input": "hi"}).encode()
    response = http.post(SESSIONS, content=body, headers={"Content-Type": content_type})
    assert response.status_code == 200, response.text
    assert http.delete(f"{SESSIONS}/{response.json()['id']}").status_code in (200, 409)
