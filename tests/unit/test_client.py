"""`cairn.Client` against a scripted HTTP transport: reconnects resume from the last
sequence number yielded, without loss or duplicates, and stop for the right reasons."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest

from cairn.client import STARTING_AFTER_HEADER, Backoff, Client, EventStreamError, SessionEvent, TurnRequiresActionError

SESSION = "sess_1"
FAST = Backoff(initial_s=0.0, max_s=0.0, jitter=0.0, max_attempts=4)


def _event(seq: int, type_: str = "agent.session.turn.output_text.delta", **fields: Any) -> dict[str, Any]:
    return {"type": type_, "event_id": f"evt_1_{seq}", "sequence_number": seq, "session_id": SESSION, **fields}


def _frame(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event).encode() + b"\n\n"


class Server:
    """Answers GET …/events from a list of events; each connection follows a plan."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.requests: list[httpx2.Request] = []
        # One entry per connection: ("cut", n) sends n bytes of the replay then fails;
        # ("end", n) sends n events then ends the body; ("status", code); ("all",) sends everything and ends.
        self.plan: list[tuple[Any, ...]] = []
        self.live_position = 0
        self.posts: list[httpx2.Request] = []
        self.post_statuses: list[int] = []  # answers to POSTs, then 202

    def client(self) -> Client:
        http = httpx2.Client(transport=httpx2.MockTransport(self.handle))
        return Client(openai_client=openai.OpenAI(base_url="http://cairn.test/v1", api_key="k", http_client=http), backoff=FAST)

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        if request.method == "POST":
            self.posts.append(request)
            return httpx2.Response(self.post_statuses.pop(0) if self.post_statuses else 202)
        self.requests.append(request)
        step = self.plan.pop(0) if self.plan else ("all",)
        if step[0] == "status":
            return httpx2.Response(step[1], json={"error": {"message": "no", "type": "x", "code": None, "param": None}})
        raw_after = request.url.params.get("starting_after")
        after = int(raw_after) if raw_after is not None else self.live_position
        replay = [e for e in self.events if e["sequence_number"] > after]
        body = b": keepalive\n\n" + b"".join(_frame(e) for e in replay)
        headers = {STARTING_AFTER_HEADER: str(after), "content-type": "text/event-stream"}
        if step[0] == "cut":
            return httpx2.Response(200, headers=headers, content=_cut(body, step[1]))
        if step[0] == "end":
            return httpx2.Response(200, headers=headers, content=b"".join(_frame(e) for e in replay[: step[1]]))
        if step[0] == "raw":
            return httpx2.Response(200, headers=headers, content=step[1])
        return httpx2.Response(200, headers=headers, content=body)


def _cut(body: bytes, size: int) -> Iterator[bytes]:
    yield body[:size]
    raise httpx2.ReadError("connection reset by peer")


def _seqs(events: list[SessionEvent]) -> list[int]:
    return [e.sequence_number for e in events]


def _take(stream: Iterator[SessionEvent], count: int) -> list[SessionEvent]:
    return [next(stream) for _ in range(count)]


def test_cuts_at_every_byte_offset_lose_and_repeat_nothing() -> None:
    events = [_event(seq, delta=f"d{seq}\n\nwith: colons") for seq in range(1, 6)]
    body_size = len(b": keepalive\n\n" + b"".join(_frame(e) for e in events))
    for offset in range(body_size):
        server = Server(events)
        server.plan = [("cut", offset)] * 3 + [("all",)]
        with server.client().events.stream(SESSION, starting_after=0) as stream:
            got = _take(stream, 5)
        assert _seqs(got) == [1, 2, 3, 4, 5], offset
        assert [e.data for e in got] == events
        asked = [r.url.params.get("starting_after") for r in server.requests]
        assert asked[0] == "0" and all(int(a) <= 5 for a in asked)


def test_resumes_from_the_last_sequence_number_yielded() -> None:
    server = Server([_event(seq) for seq in range(1, 11)])
    server.plan = [("end", 3), ("end", 4), ("all",)]
    with server.client().events.stream(SESSION, starting_after=0) as stream:
        assert _seqs(_take(stream, 10)) == list(range(1, 11))
        assert stream.reconnects == 2
    assert [r.url.params["starting_after"] for r in server.requests] == ["0", "3", "7"]


def test_live_stream_resumes_from_the_position_in_the_header() -> None:
    server = Server([_event(seq) for seq in range(1, 8)])
    server.live_position = 4
    server.plan = [("end", 0), ("all",)]
    with server.client().events.stream(SESSION) as stream:
        assert stream.connect() == 4
        assert _seqs(_take(stream, 3)) == [5, 6, 7]
    assert "starting_after" not in server.requests[0].url.params
    assert server.requests[1].url.params["starting_after"] == "4"


def test_a_deleted_session_ends_the_stream_but_an_unknown_one_raises() -> None:
    server = Server([_event(1), _event(2)])
    server.plan = [("end", 2), ("status", 404)]
    with server.client().events.stream(SESSION, starting_after=0) as stream:
        assert _seqs(list(stream)) == [1, 2]
    server = Server([])
    server.plan = [("status", 404)]
    with pytest.raises(openai.NotFoundError):
        next(server.client().events.stream(SESSION, starting_after=0))


def test_transient_statuses_are_retried_and_others_raise() -> None:
    server = Server([_event(1)])
    server.plan = [("status", 503), ("status", 429), ("status", 409), ("all",)]
    assert next(server.client().events.stream(SESSION, starting_after=0)).sequence_number == 1
    server = Server([_event(1)])
    server.plan = [("status", 401)]
    with pytest.raises(openai.AuthenticationError):
        next(server.client().events.stream(SESSION, starting_after=0))


def test_gives_up_after_the_bounded_number_of_failed_attempts() -> None:
    server = Server([_event(1)])
    server.plan = [("status", 503)] * 10
    with pytest.raises(EventStreamError, match="after 4 failed attempts"):
        next(server.client().events.stream(SESSION, starting_after=0))
    assert len(server.requests) == 4


def test_an_in_band_server_error_is_a_dropped_connection() -> None:
    server = Server([_event(1), _event(2)])
    error = {"type": "error", "event_id": "evt_error_1", "error": {"type": "server_error", "message": "database unavailable"}}
    server.plan = [("raw", _frame(_event(1)) + _frame(error))]
    with server.client().events.stream(SESSION, starting_after=0) as stream:
        assert _seqs(_take(stream, 2)) == [1, 2]


def test_a_gap_or_a_missing_sequence_number_is_an_error() -> None:
    server = Server([])
    server.plan = [("raw", _frame(_event(1)) + _frame(_event(3)))]
    with pytest.raises(EventStreamError, match="gap"):
        _take(server.client().events.stream(SESSION, starting_after=0), 2)
    server.plan = [("raw", b'data: {"type": "x", "event_id": "e"}\n\n')]
    with pytest.raises(EventStreamError, match="sequence_number"):
        next(server.client().events.stream(SESSION, starting_after=0))


def test_the_typed_event_is_the_official_model() -> None:
    turn = {"id": "turn_1", "status": "completed", "session_id": SESSION, "subagent_id": None, "extra": 1}
    server = Server([_event(1, "agent.session.turn.completed", turn_id="turn_1", turn=turn)])
    event = next(server.client().events.stream(SESSION, starting_after=0))
    assert (event.type, event.turn_id, event.event_id) == ("agent.session.turn.completed", "turn_1", "evt_1_1")
    assert type(event.event).__name__ == "AgentSessionTurnCompletedEvent"
    assert event.event.turn.id == "turn_1"  # type: ignore[union-attr]


def _turn_events(turn_id: str, text: str, first_seq: int, content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    turn = {"id": turn_id, "status": "queued", "session_id": SESSION, "subagent_id": None}
    item = {"type": "message", "role": "assistant", "phase": "final_answer", "status": "completed", "turn_id": turn_id,
            "content": [{"type": "output_text", "text": text}]}
    kinds: list[tuple[str, dict[str, Any]]] = [
        ("agent.session.turn.created", {"turn": turn}),
        ("agent.session.turn.item.added", {"item": {"type": "message", "role": "user", "content": content}}),
        ("agent.session.turn.item.done", {"item": item, "output_index": 0}),
        ("agent.session.turn.completed", {"turn": {**turn, "status": "completed"}}),
    ]
    return [_event(first_seq + i, kind, turn_id=turn_id, **fields) for i, (kind, fields) in enumerate(kinds)]


def test_run_sends_once_and_follows_its_own_turn_across_cuts() -> None:
    mine = [{"type": "input_text", "text": "hello"}]
    events = [
        *_turn_events("turn_other", "not mine", 1, [{"type": "input_text", "text": "someone else"}]),
        *_turn_events("turn_mine", "mine", 5, mine),
        _event(9, "agent.session.idle", session={"id": SESSION, "status": "idle"}),
    ]
    server = Server(events)
    server.post_statuses = [503]
    server.plan = [("cut", 0), ("cut", 700), ("cut", 1500), ("all",)]
    seen: list[int] = []
    run = server.client().sessions.run(SESSION, input="hello", on_event=lambda e: seen.append(e.sequence_number))
    assert (run.turn_id, run.status, run.output_text, run.sequence_number) == ("turn_mine", "completed", "mine", 8)
    assert seen == list(range(1, 9))
    keys = {p.headers["idempotency-key"] for p in server.posts}
    assert len(server.posts) == 2 and len(keys) == 1
    assert json.loads(server.posts[0].content)["events"][0]["input"] == [{"role": "user", "content": mine}]


def test_run_reports_a_turn_waiting_for_client_tools() -> None:
    mine = [{"type": "input_text", "text": "hello"}]
    events = _turn_events("turn_mine", "", 1, mine)[:2] + [
        _event(3, "agent.session.requires_action", session={"id": SESSION, "required_actions": [
            {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}", "turn_id": "turn_mine"}]}),
    ]
    server = Server(events)
    with pytest.raises(TurnRequiresActionError) as caught:
        server.client().sessions.run(SESSION, input="hello")
    assert (caught.value.turn_id, caught.value.sequence_number) == ("turn_mine", 3)
    assert caught.value.required_actions[0]["name"] == "lookup"


def test_official_resources_stay_available() -> None:
    server = Server([])
    client = server.client()
    assert client.beta.agents.sessions.events.create is not None
    assert client.sessions.retrieve == client.openai.beta.agents.sessions.retrieve
    assert client.events.create == client.openai.beta.agents.sessions.events.create
    assert client.sessions.events is client.events
