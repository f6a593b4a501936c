"""Run a list of independent tasks on the calling thread plus a few threads of a shared pool.

Persist and restore both consist of many small units (a batch of small files, one large
file, one range of a pack) whose cost is dominated by system calls and hashing, which release
the GIL. The calling thread works too, so a pool busy with another operation slows this one
down instead of stalling it. Tasks are taken in list order from one shared queue, so the
caller decides the schedule (long tasks first, then the many short ones fill in around them).

The first failure stops the queue: no new task starts, running ones finish, and the error is
raised only once every thread has let go of its task (callers clean up after that, e.g. delete
a staging directory, so nothing may still be writing into it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import TypeVar

__all__ = ["run_calls", "run_tasks"]

T = TypeVar("T")
S = TypeVar("S")

MAX_HELPERS = 4
"""Pool threads one operation asks for at most (the pool itself is bounded per process)."""


def run_tasks(
    executor: Executor,
    tasks: Sequence[T],
    work: Callable[[T, S], None],
    make_state: Callable[[int], S],
    *,
    helpers: int = MAX_HELPERS,
) -> list[S]:
    """Call `work(task, state)` for every task; returns the per-thread states that were used.

    `make_state(lane)` builds a thread's private state (a buffer) the first time
    that thread takes a task; lane 0 is the calling thread.
    """
    lock = threading.Lock()
    position = 0
    failed: list[BaseException] = []
    states: list[S] = []

    def next_task() -> T | None:
        nonlocal position
        with lock:
            if failed or position >= len(tasks):
                return None
            task = tasks[position]
            position += 1
            return task

    def runner(lane: int) -> None:
        state: S | None = None
        try:
            while (task := next_task()) is not None:
                if state is None:
                    state = make_state(lane)
                    with lock:
                        states.append(state)
                work(task, state)
        except BaseException as error:
            with lock:
                failed.append(error)
            raise

    futures: list[Future[None]] = [
        executor.submit(runner, lane) for lane in range(1, min(helpers, len(tasks) - 1) + 1)
    ]
    try:
        runner(0)
    except BaseException:
        pass  # recorded in `failed`; raised below once every helper has stopped
    finally:
        for future in futures:
            if not future.cancel():
                future.exception()  # wait: a helper may still be writing
    if failed:
        raise failed[0]
    return states


def run_calls(executor: Executor, calls: Sequence[Callable[[], None]]) -> None:
    """Run each of a few independent calls, side by side, under the rules of `run_tasks`."""
    run_tasks(executor, calls, lambda call, _state: call(), lambda _lane: None)
