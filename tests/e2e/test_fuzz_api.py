"""Property-based fuzzing of every route of a real `cairn serve` (issue 19).

For each route, hypothesis generates requests from three sources: valid bodies with one part
mutated (a leaf replaced by any JSON value, a key dropped or added, a value nested deep),
arbitrary JSON documents, and arbitrary bytes; with ids that are real, made up, or hostile
(percent-encoded control bytes), arbitrary query parameters and content types. Text may hold
lone surrogates (written as JSON escapes), NUL and other controls. Whatever arrives:
- never a 5xx and never a dropped connection;
- every error is the envelope of spec §1.5;
- and afterwards a session created before the barrage still runs a turn to completion, so
  nothing the barrage sent stopped the worker.

The budget is `CAIRN_FUZZ_EXAMPLES` requests per route (default 120); examples are derived
from a fixed seed, so CI runs the same requests every time.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cairn.testing.server import CairnServer
from tests.e2e.conftest import DATABASES, database_url_for, make_server, remove_server
from tests.waits import until_blocking

SESSIONS = "/agents/sessions"
EXAMPLES = int(os.environ.get("CAIRN_FUZZ_EXAMPLES", "120"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
SENT: Counter[tuple[str, str]] = Counter()

MESSAGE = {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}
VALID_BODIES: dict[str, list[dict[str, Any]]] = {
    "create": [
        {"agent": {"model": "scripted:echo"}, "environment": {"type": "none"}, "input": "hi"},
        {
            "agent": {"model": "scripted:echo", "instructions": "be brief", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]},
            "environment": {"type": "openai_hosted", "env": {"A": "1"}, "files": [{"type": "inline", "data": "aGk=", "path": "/workspace/a.txt"}]},
            "metadata": {"k": "v"}, "spend_control": {"limit": 5}, "review": "none",
        },
        {"agent": {"model": "scripted:echo"}, "environment": {"type": "none"}, "input": [MESSAGE], "stream": True},
    ],
    "update": [
        {"metadata": {"k": "v"}},
        {"agent": {"model": "scripted:echo", "tools": None}, "spend_control": {"limit": None}, "prompt_cache_options": {"ttl": "30m"}},
    ],
    "events": [
        {"events": [{"type": "agent.session.input.message", "input": [MESSAGE]}]},
        {"events": [{"type": "agent.session.input.cancel"}]},
        {"events": [{"type": "agent.session.input.tool_result", "turn_id": "turn_x", "call_id": "call_x", "success": True, "output": "o"}]},
    ],
}

# (name, method, path template, body kind or None)
ROUTES: list[tuple[str, str, str, str | None]] = [
    ("create session", "POST", SESSIONS, "create"),
    ("list sessions", "GET", SESSIONS, None),
    ("retrieve session", "GET", SESSIONS + "/{session}", None),
    ("update session", "POST", SESSIONS + "/{session}", "update"),
    ("delete session", "DELETE", SESSIONS + "/{disposable}", None),
    ("post events", "POST", SESSIONS + "/{session}/events", "events"),
    ("stream events", "GET", SESSIONS + "/{session}/events", None),
    ("list items", "GET", SESSIONS + "/{session}/items", None),
    ("list turns", "GET", SESSIONS + "/{session}/turns", None),
    ("retrieve turn", "GET", SESSIONS + "/{session}/turns/{turn}", None),
    ("list turn items", "GET", SESSIONS + "/{session}/turns/{turn}/items", None),
    ("list artifacts", "GET", SESSIONS + "/{session}/artifacts", None),
    ("retrieve artifact", "GET", SESSIONS + "/{session}/artifacts/{artifact}", None),
    ("download artifact", "GET", SESSIONS + "/{session}/artifacts/{artifact}/content", None),
    ("delete artifact", "DELETE", SESSIONS + "/{session}/artifacts/{artifact}", None),
    ("unknown route", "POST", "/agents/{session}/nowhere", "events"),
]

# Any character, lone surrogates and controls included, with the known troublemakers often.
HOSTILE = ["x\ud800y", "\udfff", "\x00", "a\x00b", "\x1b[31m", "\u2028", "²", "①", "١", "../..", "/workspace/outputs/", "a" * 300]
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=24) | st.sampled_from(HOSTILE)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=False) | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=24,
)
CONTENT_TYPES = st.sampled_from(
    ["application/json"] * 6 + ["application/json; charset=utf-8", None, "text/plain", "application/x-www-form-urlencoded",
                                "multipart/form-data; boundary=b", "application/json; charset=utf-16", "*/*", "application/xml"]
)


def _encode(value: Any) -> bytes:
    # ensure_ascii writes lone surrogates as \\udXXX escapes, as a hostile client would.
    return json.dumps(value, ensure_ascii=True).encode()


@st.composite
def _mutated(draw: st.DrawFn, template: dict[str, Any]) -> bytes:
    """A valid body with one part changed."""
    body = json.loads(json.dumps(template))
    container: Any = body
    while True:
        keys = list(container) if isinstance(container, dict) else list(range(len(container)))
        if not keys:
            break
        key = draw(st.sampled_from(keys))
        child = container[key]
        if isinstance(child, (dict, list)) and child and draw(st.booleans()):
            container = child
            continue
        action = draw(st.sampled_from(["replace", "drop", "add", "deepen"]))
        if action == "replace":
            container[key] = draw(JSON_VALUES)
        elif action == "drop" and isinstance(container, dict):
            del container[key]
        elif action == "add" and isinstance(container, dict):
            container[draw(ANY_TEXT)] = draw(JSON_VALUES)
        else:
            depth = draw(st.integers(min_value=1, max_value=5000))
            container[key] = json.loads("[" * min(depth, 60) + "]" * min(depth, 60)) if depth <= 60 else "DEEP"
            if depth > 60:
                return _encode(body).replace(b'"DEEP"', b"[" * depth + b"]" * depth)
        break
    return _encode(body)


def _body(kind: str) -> st.SearchStrategy[bytes]:
    templates = VALID_BODIES[kind]
    return st.one_of(
        st.sampled_from(templates).flatmap(_mutated),
        st.sampled_from(templates).map(_encode),
        JSON_VALUES.map(_encode),
        st.binary(max_size=64),
    )


class Targets:
    """Real ids for the routes' path parameters, re-made when the fuzzer deletes them."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self.ids: dict[str, str] = {}

    def _session(self, model: str) -> str:
        created = self.http.post(SESSIONS, json={"agent": {"model": model}, "environment": {"type": "openai_hosted"}})
        assert created.status_code == 200, created.text
        return str(created.json()["id"])

    def get(self, name: str) -> str:
        if name == "disposable":
            return self._session("scripted:echo")  # a fresh one each time: deleting it is the point
        if name not in self.ids or self.http.get(f"{SESSIONS}/{self.ids['session']}").status_code == 404:
            self._make()
        return self.ids[name]

    def _make(self) -> None:
        session = self._session("scripted:publish")
        sent = self.http.post(f"{SESSIONS}/{session}/events", json={"events": [{"type": "agent.session.input.message", "input": [MESSAGE]}]})
        assert sent.status_code == 202, sent.text
        artifacts = until_blocking(
            lambda: self.http.get(f"{SESSIONS}/{session}/artifacts").json()["data"],
            f"the fuzz target session {session} to publish an artifact", timeout_s=60,
        )
        turn = self.http.get(f"{SESSIONS}/{session}/turns").json()["data"][0]["id"]
        self.ids = {"session": session, "turn": turn, "artifact": artifacts[0]["id"]}


@pytest.fixture(params=DATABASES, scope="module")
def fuzzed_server(request: pytest.FixtureRequest, scripts_dir: Path) -> Iterator[CairnServer]:
    """A server per database: PostgreSQL refuses in text what SQLite stores (NUL)."""
    instance = make_server(scripts_dir, database_url=database_url_for(request, request.param, "fuzz")).start()
    yield instance
    remove_server(instance)


@pytest.fixture(scope="module")
def http(fuzzed_server: CairnServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {fuzzed_server.admin_key}"}
    with httpx.Client(base_url=fuzzed_server.base_url, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def witness(http: httpx.Client) -> str:
    """A session made before the barrage, whose id the fuzzer never sees."""
    created = http.post(SESSIONS, json={"agent": {"model": "scripted:echo"}, "environment": {"type": "openai_hosted"}})
    assert created.status_code == 200, created.text
    return str(created.json()["id"])


@pytest.fixture(scope="module")
def targets(http: httpx.Client) -> Targets:
    return Targets(http)


@st.composite
def _path_value(draw: st.DrawFn, name: str, targets: Targets) -> str:
    choice = draw(st.sampled_from(["real", "real", "real", "made up", "hostile"]))
    if choice == "real":
        return targets.get(name)
    if choice == "made up":
        return quote(draw(st.text(min_size=1, max_size=80)), safe="")
    return "".join(f"%{b:02X}" for b in draw(st.binary(min_size=1, max_size=12)))


def _assert_answered(response: httpx.Response, route: str) -> None:
    assert response.status_code < 500, f"{route}: {response.status_code} {response.text[:500]}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "code", "param"}, f"{route}: {error}"
        assert isinstance(error["message"], str) and error["message"], f"{route}: {error}"


@pytest.mark.parametrize(("route", "method", "template", "body_kind"), ROUTES, ids=[r[0] for r in ROUTES])
@FUZZ
@given(data=st.data())
def test_no_request_gets_a_5xx_or_a_dropped_connection(
    http: httpx.Client, targets: Targets, witness: str, route: str, method: str, template: str, body_kind: str | None, data: st.DataObject
) -> None:
    names = [n for n in ("session", "disposable", "turn", "artifact") if "{" + n + "}" in template]
    path = template.format(**{n: data.draw(_path_value(n, targets)) for n in names})
    query = data.draw(st.lists(st.tuples(st.sampled_from(["limit", "order", "after", "starting_after", "agent_id", "metadata[k]", "x"]), st.text(max_size=12)), max_size=3))
    headers: dict[bytes, bytes] = {}
    content: bytes | None = None
    if body_kind is not None:
        content = data.draw(_body(body_kind))
        content_type = data.draw(CONTENT_TYPES)
        if content_type is not None:
            headers[b"Content-Type"] = content_type.encode()
        if data.draw(st.booleans()):
            # What HTTP lets a header carry (h11 refuses the rest on the client side).
            key = data.draw(st.binary(max_size=20)).translate(None, bytes(range(0x21)) + b"\x7f").strip() or b"k"
            headers[b"Idempotency-Key"] = key
    url = path + ("?" + "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in query) if query else "")
    SENT[(http.base_url.host + str(http.base_url.port), route)] += 1
    try:
        # Streams (events, a streamed create) are read only as far as their status and headers.
        with http.stream(method, url, content=content, headers=headers) as response:
            if response.status_code >= 400 or response.headers.get("content-type", "").startswith("application/json"):
                response.read()
                _assert_answered(response, route)
            else:
                assert response.status_code < 500, f"{route}: {response.status_code}"
    except httpx.TransportError as exc:
        pytest.fail(f"{route}: the connection failed ({exc!r}) for {method} {url}")


def test_every_route_was_fuzzed_and_a_session_made_before_still_completes_a_turn(http: httpx.Client, witness: str) -> None:
    server = http.base_url.host + str(http.base_url.port)
    sent = {route: count for (where, route), count in SENT.items() if where == server}
    assert set(sent) == {r[0] for r in ROUTES} and min(sent.values()) >= EXAMPLES, sent
    print("fuzzed requests per route:", sent)
    posted = http.post(f"{SESSIONS}/{witness}/events", json={"events": [{"type": "agent.session.input.message", "input": [MESSAGE]}]})
    assert posted.status_code == 202, posted.text
    def latest_turn() -> dict[str, Any]:
        turn: dict[str, Any] = http.get(f"{SESSIONS}/{witness}/turns").json()["data"][0]
        assert turn["status"] in ("queued", "in_progress", "completed"), turn
        return turn

    until_blocking(lambda: latest_turn()["status"] == "completed", "the witness session's turn to complete",
                   timeout_s=60, seen=latest_turn)
