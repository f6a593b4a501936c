"""Background tasks that no failure can stop: long-running loops restarted, periodic steps repeated.

A background task that raises must not take the others with it (they share a task group,
which an escaping exception cancels whole) nor stop for good: that is how one malformed
session once stopped every later turn (issue 19). Each failure is logged once, with the
task's name and traceback, and the task goes on; a task that keeps failing is restarted
with a growing delay, so it cannot spin.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

__all__ = ["run_periodically", "supervise"]

log = logging.getLogger(__name__)

_MAX_RESTART_DELAY_S = 60.0


async def supervise(name: str, task: Callable[[], Awaitable[None]], *, restart_delay_s: float = 1.0) -> None:
    """Run `task` until it returns or this is cancelled, restarting it after every failure."""
    delay = restart_delay_s
    while True:
        started = anyio.current_time()
        try:
            await task()
            return
        except Exception:
            log.exception("background task %r failed; restarting it in %.1f s", name, delay)
        await anyio.sleep(delay)
        # A task that ran a good while before failing starts again from the short delay.
        ran_long = anyio.current_time() - started > _MAX_RESTART_DELAY_S
        delay = restart_delay_s if ran_long else min(delay * 2, _MAX_RESTART_DELAY_S)


async def run_periodically(name: str, interval_s: float, step: Callable[[], Awaitable[object]]) -> None:
    """Run `step` every `interval_s` until cancelled; a failed step is logged and the next one runs."""
    while True:
        await anyio.sleep(interval_s)
        try:
            await step()
        except Exception:
            log.exception("periodic task %r failed; it runs again in %.1f s", name, interval_s)
