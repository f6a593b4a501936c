"""`cairn.Client`: the official `openai` client plus what Cairn's event log makes possible.

Everything the official client offers stays available (`client.beta.agents…`, and any
other attribute is delegated to the wrapped `openai.OpenAI`). On top of it:

- `client.events.stream(session_id, starting_after=N)` yields `SessionEvent`s and never
  loses one: when the connection drops (or the body ends because a server restarted) it
  reconnects with bounded exponential backoff and asks for `starting_after=<the last
  sequence number it yielded>`, so the events it yields are exactly the session's log,
  in order, without gaps or duplicates. Without `starting_after` it starts live, at the
  position the server reports in the `x-cairn-starting-after` header, and resumes the
  same way. It ends when the session is deleted.
- `client.sessions.run(session_id, input=…)` sends one message under an Idempotency-Key
  and follows the turn it starts to its end across disconnects, returning the terminal
  turn and the output text (`TurnRun`). `client.sessions.follow(…)` does the second half
  for a turn that is already running.
- `client.artifacts.download(session_id, turn_id=…, path=…, to=…)` and `.content(…)`
  fetch an artifact by the turn that published it and its path.

The event type: a `SessionEvent` carries the fields Cairn guarantees (`sequence_number`,
`event_id`, `type`, `session_id`, `turn_id`), the decoded JSON (`data`), the exact text
(`raw`), and, parsed on first use, the official client's typed model (`event`, an
`openai.types.beta.AgentSessionEvent`, built as leniently as the official stream builds
it). This client is synchronous: it is for programs and the CLI; the server is async.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import httpx
import httpx2
import openai
from openai._models import construct_type
from openai._response import APIResponse
from openai.resources.beta.beta import Beta
from openai.types.beta import AgentSessionEvent
from openai.types.beta.agents.sessions.session_artifact import SessionArtifact
from openai.types.beta.agents.sessions.turn import Turn

__all__ = [
    "STARTING_AFTER_HEADER",
    "Backoff",
    "Client",
    "EventStreamError",
    "ResumableEventStream",
    "SessionEvent",
    "TurnRequiresActionError",
    "TurnRun",
]

log = logging.getLogger(__name__)

STARTING_AFTER_HEADER = "x-cairn-starting-after"
_TERMINAL_TURN_EVENTS = frozenset(
    {"agent.session.turn.completed", "agent.session.turn.failed", "agent.session.turn.cancelled"}
)


class EventStreamError(RuntimeError):
    """The server broke the replay contract (no `sequence_number`, a gap), or reconnecting failed for good."""


class _ServerStreamError(EventStreamError):
    """The server reported a failure in-band (spec §1.9.5); the log is intact, so resume."""


# Errors of a connection, whichever httpx the official client was given.
_TRANSPORT_ERRORS: tuple[type[Exception], ...] = (httpx2.TransportError, httpx.TransportError)
# What ends one connection but not the stream: reconnect from the last position.
_DROPPED: tuple[type[Exception], ...] = (*_TRANSPORT_ERRORS, _ServerStreamError)
_CLOSE_ERRORS: tuple[type[Exception], ...] = (*_TRANSPORT_ERRORS, openai.APIError)


class TurnRequiresActionError(Exception):
    """The followed turn waits for client tool results; post them, then `sessions.follow` again from `sequence_number`."""

    def __init__(self, session_id: str, turn_id: str, required_actions: list[dict[str, Any]], sequence_number: int) -> None:
        names = ", ".join(str(a.get("name")) for a in required_actions)
        super().__init__(f"turn {turn_id} waits for client actions: {names}")
        self.session_id = session_id
        self.turn_id = turn_id
        self.required_actions = required_actions
        self.sequence_number = sequence_number


@dataclass(frozen=True, slots=True)
class Backoff:
    """Reconnect policy: delays `initial_s`, ×`multiplier` each time, capped at `max_s`, with
    ±`jitter` of randomness; after `max_attempts` consecutive failures the last error is raised.
    A connection that delivers an event, or stays up for `healthy_s`, resets the count."""

    initial_s: float = 0.1
    multiplier: float = 2.0
    max_s: float = 5.0
    jitter: float = 0.2
    max_attempts: int = 10
    healthy_s: float = 5.0

    def delay_s(self, attempt: int) -> float:
        base = min(self.max_s, self.initial_s * self.multiplier ** max(0, attempt - 1))
        return float(base * (1 + self.jitter * (2 * random.random() - 1)))


class SessionEvent:
    """One event of a session's log, as received."""

    __slots__ = ("_event", "data", "event_id", "raw", "sequence_number", "session_id", "turn_id", "type")

    def __init__(self, raw: str, data: dict[str, Any]) -> None:
        self.raw = raw
        self.data = data
        self.sequence_number: int = data["sequence_number"]
        self.event_id: str = data.get("event_id") or ""
        self.type: str = data.get("type") or ""
        self.session_id: str | None = data.get("session_id")
        self.turn_id: str | None = data.get("turn_id")
        self._event: AgentSessionEvent | None = None

    @property
    def event(self) -> AgentSessionEvent:
        """The official client's typed model of this event (lenient: unknown fields are kept)."""
        if self._event is None:
            self._event = cast(AgentSessionEvent, construct_type(type_=AgentSessionEvent, value=self.data))
        return self._event

    def __repr__(self) -> str:
        return f"SessionEvent(sequence_number={self.sequence_number}, type={self.type!r})"


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The `data` of each dispatched server-sent event; comments and other fields are skipped."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    # Data left over here belongs to an event cut off mid-way: it was never dispatched
    # (WHATWG), so it is not yielded, and the next connection replays it.


def _is_retryable_status(exc: openai.APIStatusError) -> bool:
    return exc.status_code in (408, 409, 429) or exc.status_code >= 500


class ResumableEventStream(AbstractContextManager["ResumableEventStream"], Iterator[SessionEvent]):
    """An iterator over a session's events that survives disconnects; see the module docstring.

    `position` is the sequence number of the last event yielded (or the starting point);
    `reconnects` counts the connections opened after the first.
    """

    def __init__(
        self, client: openai.OpenAI, session_id: str, starting_after: int | None, backoff: Backoff, read_timeout_s: float
    ) -> None:
        self._client = client
        self.session_id = session_id
        self.position = starting_after
        self.backoff = backoff
        self.read_timeout_s = read_timeout_s
        self.reconnects = 0
        self._connected_once = False
        self._response: APIResponse[Any] | None = None
        self._context: AbstractContextManager[APIResponse[Any]] | None = None
        self._events: Iterator[str] | None = None
        self._closed = False
        self._failures = 0
        self._connected_at = 0.0

    # -- connection -------------------------------------------------------------------

    def connect(self) -> int | None:
        """Open the connection now (iteration does it on demand); returns the position it starts after."""
        if self._events is None:
            self._open()
        return self.position

    def _open(self) -> None:
        """Connect, retrying under the backoff policy; raises StopIteration if the session is gone."""
        while True:
            if self._closed:
                raise StopIteration
            query = {} if self.position is None else {"starting_after": self.position}
            context = self._client.beta.agents.sessions.events.with_streaming_response.stream(
                self.session_id,
                extra_query=query,
                timeout=httpx2.Timeout(self.read_timeout_s, connect=10.0),
            )
            try:
                response = context.__enter__()
            except openai.NotFoundError:
                if self._connected_once:
                    raise StopIteration from None  # the session was deleted while we were away
                raise
            except openai.APIStatusError as exc:
                if not _is_retryable_status(exc):
                    raise
                self._failed(exc)
                continue
            except openai.APIConnectionError as exc:
                self._failed(exc)
                continue
            header = response.headers.get(STARTING_AFTER_HEADER)
            if self.position is None and header is not None and header.isdigit():
                self.position = int(header)
            if self._connected_once:
                self.reconnects += 1
            self._connected_once = True
            self._context, self._response = context, response
            self._events = _sse_data(response.iter_lines())
            self._connected_at = time.monotonic()
            return

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        if self._failures >= self.backoff.max_attempts:
            raise EventStreamError(
                f"gave up on the event stream of {self.session_id} after {self._failures} failed attempts: {exc}"
            ) from exc
        delay = self.backoff.delay_s(self._failures)
        log.info("event stream of %s: %s; reconnecting in %.2f s", self.session_id, exc, delay)
        time.sleep(delay)

    def _drop_best_effort(self) -> None:
        """Forget the connection; a failure to close one that is already broken is only logged."""
        context, self._context, self._response, self._events = self._context, None, None, None
        if context is not None:
            try:
                context.__exit__(None, None, None)
            except _CLOSE_ERRORS as exc:
                log.warning("closing a broken event stream connection failed: %s", exc)

    # -- iteration --------------------------------------------------------------------

    def __iter__(self) -> ResumableEventStream:
        return self

    def __next__(self) -> SessionEvent:
        while True:
            if self._closed:
                raise StopIteration
            if self._events is None:
                self._open()
            assert self._events is not None
            try:
                event = self._accept(next(self._events))
            except StopIteration:
                reason: Exception = EventStreamError("the server ended the stream")
            except _DROPPED as exc:
                reason = exc
            else:
                if event is not None:
                    return event
                continue
            # The connection is gone: reconnect from the last position we yielded.
            healthy = time.monotonic() - self._connected_at >= self.backoff.healthy_s
            self._drop_best_effort()
            if healthy:
                self._failures = 0
            self._failed(reason)

    def _accept(self, raw: str) -> SessionEvent | None:
        if raw.startswith("[DONE]"):
            self._closed = True
            self._drop_best_effort()
            return None
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise EventStreamError(f"not an event object: {raw[:200]!r}")
        seq = data.get("sequence_number")
        if not isinstance(seq, int):
            if data.get("error"):
                message = data["error"].get("message") if isinstance(data["error"], dict) else data["error"]
                raise _ServerStreamError(str(message))
            raise EventStreamError(f"event without a sequence_number (is this a Cairn server?): {raw[:200]!r}")
        if self.position is not None and seq <= self.position:
            return None  # already yielded before a reconnect
        if self.position is not None and seq != self.position + 1:
            raise EventStreamError(f"gap in the event stream of {self.session_id}: {self.position} then {seq}")
        self.position = seq
        self._failures = 0
        return SessionEvent(raw, data)

    def close(self) -> None:
        self._closed = True
        self._drop_best_effort()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

class EventStreams:
    """`client.events`: resumable streams, and `create` (input events) of the official client."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def stream(self, session_id: str, *, starting_after: int | None = None) -> ResumableEventStream:
        """Every event after `starting_after` (0 = the whole log), then live; live-only when None."""
        if not session_id:
            raise ValueError("session_id must not be empty")
        return ResumableEventStream(
            self._client.stream_client, session_id, starting_after, self._client.backoff, self._client.read_timeout_s
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client.openai.beta.agents.sessions.events, name)


@dataclass(slots=True)
class TurnRun:
    """The end of one followed turn."""

    session_id: str
    turn_id: str
    turn: Turn
    output_text: str
    # Sequence number of the terminal turn event: resume a later stream from here.
    sequence_number: int
    events: list[SessionEvent] = field(default_factory=list)

    @property
    def status(self) -> str:
        return str(self.turn.status)


def _input_messages(input: str | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(input, str):
        return [{"role": "user", "content": [{"type": "input_text", "text": input}]}]
    messages = [dict(m) for m in input]
    if not messages:
        raise ValueError("input must not be empty")
    for message in messages:
        if isinstance(message.get("content"), str):
            message["content"] = [{"type": "input_text", "text": message["content"]}]
        message.setdefault("role", "user")
    return messages


class _TurnFollower:
    """Finds the followed turn in the stream and collects it until its terminal event."""

    def __init__(self, session_id: str, turn_id: str | None, first_content: Any, keep_events: bool) -> None:
        self.session_id = session_id
        self.turn_id = turn_id
        self.first_content = first_content
        self.keep_events = keep_events
        # Root turns created since we started and not yet told apart, with their events so far.
        self.candidates: dict[str, list[SessionEvent]] = {}
        self.events: list[SessionEvent] = []
        self.messages: dict[int, str] = {}

    def feed(self, event: SessionEvent) -> TurnRun | None:
        data = event.data
        if self.turn_id is None:
            self._identify(event)
        if self.turn_id is None or event.turn_id != self.turn_id:
            if event.type == "agent.session.failed":
                raise EventStreamError(f"session {self.session_id} failed: {(data.get('session') or {}).get('error')}")
            return None
        if self.keep_events:
            self.events.append(event)
        if event.type == "agent.session.turn.item.done":
            item = data.get("item") or {}
            if item.get("type") == "message" and item.get("role") == "assistant" and item.get("phase") != "commentary" \
                    and item.get("status") == "completed":
                text = "".join(p.get("text", "") for p in item.get("content") or [] if p.get("type") == "output_text")
                self.messages[int(data.get("output_index") or 0)] = text
        if event.type in _TERMINAL_TURN_EVENTS:
            return TurnRun(
                session_id=self.session_id,
                turn_id=self.turn_id,
                turn=cast(Turn, construct_type(type_=Turn, value=data.get("turn") or {})),
                output_text="".join(self.messages[i] for i in sorted(self.messages)),
                sequence_number=event.sequence_number,
                events=self.events,
            )
        return None

    def _identify(self, event: SessionEvent) -> None:
        """Ours is the first root turn created after the send whose first user message is our input."""
        data = event.data
        turn_id = event.turn_id
        if event.type == "agent.session.turn.created" and (data.get("turn") or {}).get("subagent_id") is None:
            self.candidates[str(turn_id)] = []
        if turn_id not in self.candidates:
            return
        if event.type == "agent.session.turn.item.added":
            item = data.get("item") or {}
            if item.get("role") == "user" and item.get("content") == self.first_content:
                self._choose(str(turn_id))
            else:
                del self.candidates[str(turn_id)]
        elif event.type in _TERMINAL_TURN_EVENTS and len(self.candidates) == 1:
            # Ended before it started (cancelled while queued): ours if it is the only candidate.
            self._choose(str(turn_id))
        else:
            self.candidates[str(turn_id)].append(event)

    def _choose(self, turn_id: str) -> None:
        self.turn_id = turn_id
        if self.keep_events:
            self.events.extend(self.candidates[turn_id])
        self.candidates.clear()


class Sessions:
    """`client.sessions`: the official sessions resource plus `run` and `follow`."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.events = client.events
        self.artifacts = client.artifacts

    def run(
        self,
        session_id: str,
        *,
        input: str | Sequence[Mapping[str, Any]],
        idempotency_key: str | None = None,
        on_event: Callable[[SessionEvent], None] | None = None,
        keep_events: bool = False,
    ) -> TurnRun:
        """Send `input` as one message and follow the turn it starts to its end, across disconnects.

        The message goes out under one Idempotency-Key (a fresh UUID unless given) and is
        resent with that key after a connection error, so it starts at most one turn. The
        turn is recognised as the first root turn created after the send whose user
        message equals `input`. Raises `TurnRequiresActionError` if the turn waits for
        client tool results.
        """
        messages = _input_messages(input)
        key = idempotency_key or str(uuid.uuid4())
        with self.events.stream(session_id) as stream:
            stream.connect()
            self._send(session_id, messages, key)
            follower = _TurnFollower(session_id, None, messages[0]["content"], keep_events)
            return self._follow(stream, follower, on_event)

    def follow(
        self,
        session_id: str,
        turn_id: str,
        *,
        starting_after: int = 0,
        on_event: Callable[[SessionEvent], None] | None = None,
        keep_events: bool = False,
    ) -> TurnRun:
        """Follow `turn_id` from the log after `starting_after` to its terminal event."""
        with self.events.stream(session_id, starting_after=starting_after) as stream:
            return self._follow(stream, _TurnFollower(session_id, turn_id, None, keep_events), on_event)

    def _send(self, session_id: str, messages: list[dict[str, Any]], key: str) -> None:
        body = [{"type": "agent.session.input.message", "input": messages}]
        backoff = self._client.backoff
        attempt = 0
        while True:
            try:
                self._client.openai.beta.agents.sessions.events.create(
                    session_id, events=cast(Any, body), extra_headers={"Idempotency-Key": key}
                )
                return
            except (openai.APIConnectionError, openai.InternalServerError) as exc:
                # Safe to resend: the server applies one key at most once.
                attempt += 1
                if attempt >= backoff.max_attempts:
                    raise
                delay = backoff.delay_s(attempt)
                log.info("sending input to %s failed (%s); retrying in %.2f s", session_id, exc, delay)
                time.sleep(delay)

    def _follow(
        self, stream: ResumableEventStream, follower: _TurnFollower, on_event: Callable[[SessionEvent], None] | None
    ) -> TurnRun:
        for event in stream:
            if on_event is not None:
                on_event(event)
            result = follower.feed(event)
            if result is not None:
                return result
            if event.type == "agent.session.requires_action" and follower.turn_id is not None:
                session = event.data.get("session") or {}
                actions = [a for a in session.get("required_actions") or [] if a.get("turn_id") == follower.turn_id]
                if actions:
                    raise TurnRequiresActionError(stream.session_id, follower.turn_id, actions, event.sequence_number)
        raise EventStreamError(f"session {stream.session_id} was deleted before turn {follower.turn_id or '?'} ended")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client.openai.beta.agents.sessions, name)


class Artifacts:
    """`client.artifacts`: the official artifacts resource plus lookup by (turn, path)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def find(self, session_id: str, *, turn_id: str, path: str) -> SessionArtifact:
        """The one artifact that `turn_id` published at `path`; LookupError if none or several."""
        found = [
            a
            for a in self._client.openai.beta.agents.sessions.artifacts.list(session_id)
            if a.turn_id == turn_id and a.path == path
        ]
        if len(found) != 1:
            raise LookupError(f"{len(found)} artifacts of session {session_id} match turn {turn_id} and path {path!r}")
        return found[0]

    def content(self, session_id: str, *, turn_id: str, path: str) -> bytes:
        artifact = self.find(session_id, turn_id=turn_id, path=path)
        return self._client.openai.beta.agents.sessions.artifacts.content(artifact.id, session_id=session_id).read()

    def download(self, session_id: str, *, turn_id: str, path: str, to: str | PathLike[str]) -> Path:
        """Stream the artifact to `to` (written in full or not at all) and return that path."""
        artifact = self.find(session_id, turn_id=turn_id, path=path)
        target = Path(to)
        partial = target.with_name(f".{target.name}.part")
        resource = self._client.openai.beta.agents.sessions.artifacts
        try:
            with resource.with_streaming_response.content(artifact.id, session_id=session_id) as response:
                response.stream_to_file(partial)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        return target

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client.openai.beta.agents.sessions.artifacts, name)


class Client:
    """Cairn's Python client; see the module docstring.

    Give it `base_url` and `api_key` (default: `CAIRN_BASE_URL`, else
    http://127.0.0.1:8321/v1, and `CAIRN_API_KEY`, else the official client's
    `OPENAI_API_KEY`), or an already configured `openai.OpenAI` as `openai_client`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        openai_client: openai.OpenAI | None = None,
        backoff: Backoff = Backoff(),
        read_timeout_s: float = 60.0,
        **openai_kwargs: Any,
    ) -> None:
        if openai_client is None:
            openai_client = openai.OpenAI(
                base_url=base_url or os.environ.get("CAIRN_BASE_URL") or "http://127.0.0.1:8321/v1",
                api_key=api_key or os.environ.get("CAIRN_API_KEY") or os.environ.get("OPENAI_API_KEY"),
                **openai_kwargs,
            )
        elif base_url is not None or api_key is not None or openai_kwargs:
            raise ValueError("pass either openai_client or the options to build one, not both")
        self.openai = openai_client
        # Streams retry under `backoff` alone, not also under the official client's retries.
        self.stream_client = openai_client.with_options(max_retries=0)
        self.backoff = backoff
        # A stream gets a keepalive every 15 s; a silence of `read_timeout_s` means a dead connection.
        self.read_timeout_s = read_timeout_s
        self.events = EventStreams(self)
        self.artifacts = Artifacts(self)
        self.sessions = Sessions(self)

    @property
    def beta(self) -> Beta:
        return self.openai.beta

    def __getattr__(self, name: str) -> Any:
        return getattr(self.openai, name)

    def close(self) -> None:
        self.openai.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
