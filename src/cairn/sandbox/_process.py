"""Supervises one command's host process: streams output, enforces the timeout, reaps the tree.

Every backend launches differently but ends the same way (base.py invariants, design
invariant 8): output is streamed as it arrives, the wall-clock timeout and cancellation of
the awaiting task both kill the whole process tree, and leftovers (a command's background
processes) are killed when the main process exits, before `exec` returns. Nothing here
blocks the event loop: the child is awaited through anyio and the pipe is read
asynchronously.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

from cairn.errors import SandboxError
from cairn.sandbox._kill import sigkill_group
from cairn.sandbox.base import ExecResult, OutputSink

__all__ = ["Launch", "run_supervised"]

# Called once the main process has exited or been killed; kills whatever it left behind.
ReapLeftovers = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Launch:
    """How to start the host process that runs (or supervises) the command."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: Path | None = None
    pass_fds: Sequence[int] = field(default_factory=tuple)


async def run_supervised(
    launch: Launch,
    *,
    timeout_s: float,
    on_output: OutputSink,
    reap_leftovers: ReapLeftovers,
) -> ExecResult:
    """Run `launch` to completion and return how it ended; see the module docstring."""
    started = time.monotonic()
    process = await _spawn(launch)
    killed = timed_out = reaped = False
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_pump, process, on_output)
            with anyio.move_on_after(timeout_s) as deadline:
                await process.wait()
            if deadline.cancelled_caught:
                timed_out = killed = True
                process.kill()
            # Reaping here (not only in `finally`) closes pipes held by background
            # processes, so the pump sees end-of-file and the task group can finish.
            await _reap(process, reap_leftovers)
            reaped = True
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                killed = True
                process.kill()
            await process.wait()
            if not reaped:
                await _reap(process, reap_leftovers)
            await process.aclose()
    return _result(process.returncode, killed=killed, timed_out=timed_out, started=started)


async def _reap(process: anyio.abc.Process, reap_leftovers: ReapLeftovers) -> None:
    """Kill the launcher's process group, then whatever the backend knows escaped it.

    The group id stays reserved while any member lives, so signalling it right after the
    leader was reaped cannot hit an unrelated process group.
    """
    sigkill_group(process.pid)
    await reap_leftovers()


async def _spawn(launch: Launch) -> anyio.abc.Process:
    try:
        return await anyio.open_process(
            list(launch.argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(launch.env),
            cwd=launch.cwd,
            # Its own session: terminal signals aimed at the server never reach commands,
            # and a backend can signal the whole group.
            start_new_session=True,
            pass_fds=launch.pass_fds,
        )
    except OSError as exc:
        raise SandboxError(
            f"could not start sandboxed command: {exc}",
            context={"argv0": launch.argv[0]},
        ) from exc


async def _pump(process: anyio.abc.Process, on_output: OutputSink) -> None:
    if process.stdout is None:
        raise SandboxError("sandboxed command has no output pipe")
    async for chunk in process.stdout:
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
