"""Supervises one command: streams output, enforces the timeout, reaps the whole tree.

Every backend confines differently but ends the same way (base.py invariants, design
invariant 8): output is streamed as it arrives, the wall-clock timeout and cancellation of
the awaiting task both kill the whole process tree, and leftovers (a command's background
processes) are killed when the main process exits, before `exec` returns. Nothing here
blocks the event loop: the command's pipe and status are read asynchronously.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Awaitable, Callable

import anyio

from cairn.sandbox._forkserver import ForkedCommand
from cairn.sandbox._kill import sigkill_group
from cairn.sandbox.base import ExecResult, OutputSink

__all__ = ["run_supervised"]

# Called once the main process has exited or been killed; kills whatever it left behind.
ReapLeftovers = Callable[[], Awaitable[None]]


async def run_supervised(
    command: ForkedCommand,
    *,
    timeout_s: float,
    on_output: OutputSink,
    reap_leftovers: ReapLeftovers,
) -> ExecResult:
    """Supervise `command` (just handed to the fork server) to its end; see module docstring."""
    started = time.monotonic()
    killed = timed_out = reaped = False
    try:
        await command.started()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_pump, command, on_output)
            with anyio.move_on_after(timeout_s) as deadline:
                await command.wait()
            if deadline.cancelled_caught:
                timed_out = killed = True
                command.kill()
            # Reaping here (not only in `finally`) closes pipes held by background
            # processes, so the pump sees end-of-file and the task group can finish.
            await _reap(command, reap_leftovers)
            reaped = True
    finally:
        with anyio.CancelScope(shield=True):
            try:
                if not command.pid:
                    await command.started()  # cancelled before the pid arrived: get it
                if command.returncode is None:
                    killed = True
                    command.kill()
                await command.wait()
                if not reaped:
                    await _reap(command, reap_leftovers)
            finally:
                command.close()
    return _result(command.returncode, killed=killed, timed_out=timed_out, started=started)


async def _reap(command: ForkedCommand, reap_leftovers: ReapLeftovers) -> None:
    """Kill the command's process group (it is a session leader), then what escaped it.

    The group id stays reserved while any member lives, so signalling it right after the
    leader was reaped cannot hit an unrelated process group.
    """
    sigkill_group(command.pid)
    await reap_leftovers()


async def _pump(command: ForkedCommand, on_output: OutputSink) -> None:
    async for chunk in command.output():
        await on_output(chunk)


def _result(
    returncode: int | None, *, killed: bool, timed_out: bool, started: float
) -> ExecResult:
    duration_s = time.monotonic() - started
    if killed or returncode is None:
        return ExecResult(
            exit_code=None, duration_s=duration_s, timed_out=timed_out, signal=signal.SIGKILL
        )
    if returncode < 0:
        return ExecResult(exit_code=None, duration_s=duration_s, signal=-returncode)
    return ExecResult(exit_code=returncode, duration_s=duration_s)
