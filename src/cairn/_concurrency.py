"""Moves blocking work off the event loop.

File, tar, hash and other sync library calls go through `run_sync` so that a slow disk
never stalls the server's event loop (style: async boundaries). anyio's default thread
limiter is per event loop and bounded (40 threads), so no module-level state is needed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import ParamSpec, TypeVar

import anyio.to_thread

__all__ = ["run_sync"]

P = ParamSpec("P")
T = TypeVar("T")


async def run_sync(func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run `func` in a worker thread and return its result."""
    return await anyio.to_thread.run_sync(partial(func, *args, **kwargs))
