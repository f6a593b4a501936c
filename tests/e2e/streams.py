"""Waiting on a session's event stream in end-to-end tests.

Every wait ends at the event it waits for or fails with the event types it saw: a stream
that ends first, or stays quiet past the deadline, is a failure, never a silent return.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

import httpx

from cairn.testing.server import CairnServer

__all__ = ["TERMINAL", "EventTail", "read_turn", "read_until"]

TERMINAL = ("agent.session.turn.completed", "agent.session.turn.failed", "agent.session.turn.cancelled")


class EventTail:
    """Reads a session's log over SSE (Cairn's `starting_after`), each wait from where the last stopped."""

    def __init__(self, server: CairnServer, session_id: str) -> None:
        self.server = server
        self.session_id = session_id
        self.events: list[dict[str, Any]] = []

    def until(self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float = 60) -> dict[str, Any]:
        """The first event from here on that matches `predicate`."""
        after = self.events[-1]["sequence_number"] if self.events else 0
        deadline = time.monotonic() + timeout_s
        try:
            with httpx.stream(
                "GET", f"{self.server.base_url}/agents/sessions/{self.session_id}/events", params={"starting_after": after},
                headers={"Authorization": f"Bearer {self.server.admin_key}"}, timeout=timeout_s,
            ) as response:
                if response.status_code != 200:
                    raise AssertionError(f"the event stream answered {response.status_code}: {response.read().decode()}")
                for line in response.iter_lines():  # keepalives bring the deadline check on a quiet stream
                    if time.monotonic() > deadline:
                        break
                    if line.startswith("data: "):
                        event = json.loads(line[len("data: "):])
                        self.events.append(event)
                        if predicate(event):
                            return event
        except httpx.TimeoutException as exc:  # silent past the deadline, keepalives included
            raise self._missed(timeout_s) from exc
        raise self._missed(timeout_s)

    def _missed(self, timeout_s: float) -> AssertionError:
        return AssertionError(f"no matching event in {timeout_s} s; saw {[e['type'] for e in self.events]}")


class _Event(Protocol):
    @property
    def type(self) -> str: ...


E = TypeVar("E", bound=_Event)


def read_until(stream: Iterable[E], last: Callable[[E], bool], what: str) -> list[E]:
    """The events up to the first for which `last` is true (`what` names it in the failure)."""
    events: list[E] = []
    for event in stream:
        events.append(event)
        if last(event):
            return events
    raise AssertionError(f"the stream ended before {what}; saw {[e.type for e in events]}")


def read_turn(stream: Iterable[E]) -> list[E]:
    """The events up to the `idle` that follows the first turn's terminal event."""
    ended = False

    def idle_after_the_turn(event: E) -> bool:
        nonlocal ended
        ended = ended or event.type in TERMINAL
        return ended and event.type == "agent.session.idle"

    return read_until(stream, idle_after_the_turn, "the turn's idle")
