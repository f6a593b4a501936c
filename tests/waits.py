"""Waiting in tests for an observable state, never for a fixed time.

Every wait polls its condition until it holds or a deadline passes, and then fails with what
it waited for (and what it last saw, when the caller says how to look), so a test that waits
for something that never happens fails at once and says why instead of passing or hanging.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

__all__ = ["until", "until_blocking"]

T = TypeVar("T")

_POLL_S = 0.01


def _timed_out(what: str, timeout_s: float, seen: Callable[[], object] | None) -> AssertionError:
    message = f"timed out after {timeout_s} s waiting for {what}"
    if seen is not None:
        message += f"; last saw {seen()!r}"
    return AssertionError(message)


async def until(
    condition: Callable[[], T | Awaitable[T]],
    what: str,
    *,
    timeout_s: float = 10.0,
    interval_s: float = _POLL_S,
    seen: Callable[[], object] | None = None,
) -> T:
    """The first truthy value of `condition` (a function or a coroutine function), polled on the event loop."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        result: T = await value if inspect.isawaitable(value) else value  # type: ignore[assignment]
        if result:
            return result
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s, seen)
        await anyio.sleep(interval_s)


def until_blocking(
    condition: Callable[[], T],
    what: str,
    *,
    timeout_s: float = 10.0,
    interval_s: float = _POLL_S,
    seen: Callable[[], object] | None = None,
) -> T:
    """`until` for tests without an event loop: polls in the calling thread."""
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s, seen)
        time.sleep(interval_s)
    return result
