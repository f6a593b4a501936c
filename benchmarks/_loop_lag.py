"""Event-loop lag while some work runs: how late a ticker on the same loop wakes.

Shared by the benchmarks that must show work never blocks the loop (a stalled loop stalls
every request of the server). The ticker sleeps 5 ms at a time; its worst lateness is the
longest time the loop could not run anything else.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")
TICK_S = 0.005


async def with_loop_lag(work: Callable[[], Awaitable[T]]) -> tuple[float, float, T]:
    """(seconds `work` took, worst loop lag in ms meanwhile, its result)."""
    lags: list[float] = []
    done = anyio.Event()

    async def ticker() -> None:
        while not done.is_set():
            before = time.perf_counter()
            await anyio.sleep(TICK_S)
            lags.append(time.perf_counter() - before - TICK_S)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        start = time.perf_counter()
        result = await work()
        elapsed = time.perf_counter() - start
        done.set()
    return elapsed, max(lags, default=0.0) * 1000, result


async def idle_loop_lag_ms(seconds: float = 0.5) -> float:
    """The ticker's worst lag with nothing else running: the scale for every other figure."""
    _, lag, _ = await with_loop_lag(lambda: anyio.sleep(seconds))
    return lag
