"""Sandbox overhead: each isolating backend against a direct subprocess, in the same run.

Not part of the test run. Prints three figures per backend (issue 3 targets in brackets):
- per-command overhead: median wall time of `true` run N times (default 200) through
  `backend.exec` minus the median of the same command as a direct anyio subprocess,
  round-robin so background load hits all alike [<= 20 ms]. `bwrap` is bwrap's default
  form (one container per session workspace, which every command joins, where the host
  allows it; its first command, which starts the container, is one of the N);
  `bwrap-per-command` is its other form, a fresh container for each command;
- the first command in a new workspace: `true` in a fresh workspace each time, round-robin
  over the backends (for `bwrap` this includes starting the session's container);
- throughput of `tar -cf - .` over a 100 MB workspace (90 x 1 MiB + 10240 x 1 KiB files),
  streamed out through `on_output` inside the sandbox vs. read from a direct subprocess
  [inside within 10% of outside], end to end (start to exit status, so including the
  per-command overhead) and streaming alone (first to last chunk of output); in a
  shuffled order each round, each run after a 0.2 s pause, after a `sync` (the new files'
  writeback) and one uncounted warm-up round.

The direct baseline reads its output exactly as every backend does (the same pipe size,
read size and non-blocking read loop, `cairn.sandbox._forkserver`) into the same sink, so
the ratio is the cost of isolation alone. For reference: the `setsid` row is the same
direct subprocess in a new session, as every sandboxed command is (with autogroup
scheduling, the Linux default, a session is its own CPU scheduling group); the `anyio`
row is a direct subprocess read through anyio's own process stream (default 64 KiB pipe).

Usage: .venv/bin/python benchmarks/sandbox.py [--runs 200] [--first-runs 20] [--tar-runs 11]
                            [--backends bwrap,bwrap-per-command,namespaces,landlock]
Run as root it measures the full production path (dedicated host uid, cgroups, rlimits).
Backends that do not work on this host are listed with the reason and left out.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from cairn.errors import SandboxError
from cairn.sandbox import ExecRequest, SandboxBackend, select_backend
from cairn.sandbox._forkserver import output_pipe, read_output
from cairn.sandbox.bwrap_sessions import detect_bwrap
from cairn.sandbox.selection import ISOLATING_BACKENDS

MIB = 1024 * 1024
SETTLE_S = 0.2
PER_COMMAND_BWRAP = "bwrap-per-command"


async def direct(
    command: str, cwd: Path, on_output: Callable[[bytes], Awaitable[None]],
    *, new_session: bool = False,
) -> None:
    """A direct subprocess whose output is read the way the backends read theirs."""
    read_end, write_end = output_pipe()
    try:
        try:
            process = await anyio.open_process(
                ["/bin/sh", "-c", command], stdout=write_end, stderr=write_end, cwd=cwd,
                start_new_session=new_session,
            )
        finally:
            os.close(write_end)
        os.set_blocking(read_end, False)
        async with process:
            async for chunk in read_output(read_end):
                await on_output(chunk)
            await process.wait()
    finally:
        os.close(read_end)


async def direct_anyio(
    command: str, cwd: Path, on_output: Callable[[bytes], Awaitable[None]]
) -> None:
    """A direct subprocess read through anyio's process stream (for reference)."""
    process = await anyio.open_process(
        ["/bin/sh", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd
    )
    async with process:
        assert process.stdout is not None
        async for chunk in process.stdout:
            await on_output(chunk)
        await process.wait()


async def sandboxed(
    backend: SandboxBackend, command: str, workspace: Path,
    on_output: Callable[[bytes], Awaitable[None]],
) -> None:
    result = await backend.exec(
        ExecRequest(command=command, workspace=workspace, timeout_s=300), on_output
    )
    if result.exit_code != 0:
        raise SystemExit(f"sandboxed {command!r} failed: {result}")


class Counter:
    """Counts bytes and notes when the first and the last chunk arrived."""

    def __init__(self) -> None:
        self.total = 0
        self.first = self.last = 0.0

    async def __call__(self, chunk: bytes) -> None:
        self.last = time.perf_counter()
        if not self.total:
            self.first = self.last
        self.total += len(chunk)


def make_big_workspace(path: Path) -> int:
    block = os.urandom(MIB)
    for index in range(90):
        (path / f"big-{index:02d}.bin").write_bytes(block)
    small = path / "small"
    small.mkdir()
    for index in range(10240):
        (small / f"{index:05d}.txt").write_bytes(block[index % 1000 : index % 1000 + 1024])
    return 90 * MIB + 10240 * 1024


async def time_true(
    name: str, backends: dict[str, SandboxBackend], workspace: Path, sink: Counter
) -> float:
    """Seconds `true` takes directly ("direct") or through the backend called `name`."""
    started = time.perf_counter()
    if name == "direct":
        await direct("true", workspace, sink)
    else:
        await sandboxed(backends[name], "true", workspace, sink)
    return time.perf_counter() - started


async def bench_overhead(
    backends: dict[str, SandboxBackend], workspace: Path, runs: int
) -> None:
    sink = Counter()
    timings: dict[str, list[float]] = {"direct": [], **{name: [] for name in backends}}
    for _ in range(runs):
        for name, values in timings.items():
            values.append(await time_true(name, backends, workspace, sink))
    print_overheads(
        f"`true` x{runs}, median (p90) ms, overhead = median - direct median (target <= 20):",
        timings,
    )


async def bench_first_command(
    backends: dict[str, SandboxBackend], root: Path, runs: int
) -> None:
    sink = Counter()
    timings: dict[str, list[float]] = {"direct": [], **{name: [] for name in backends}}
    for index in range(runs):
        for name, values in timings.items():
            workspace = root / f"first-{name}-{index}"
            workspace.mkdir()
            if name != "direct":
                await backends[name].prepare_workspace(workspace)
            values.append(await time_true(name, backends, workspace, sink))
            if name != "direct":
                await backends[name].release_workspace(workspace)
    print_overheads(
        f"first `true` in a new workspace x{runs}, median (p90) ms, overhead = median - direct "
        "median:",
        timings,
    )


def print_overheads(title: str, timings: dict[str, list[float]]) -> None:
    medians = {name: statistics.median(values) * 1000 for name, values in timings.items()}
    p90 = {name: statistics.quantiles(values, n=10)[-1] * 1000 for name, values in timings.items()}
    print(title)
    for name in timings:
        overhead = "" if name == "direct" else f"  overhead {medians[name] - medians['direct']:6.2f}"
        print(f"  {name:17s} {medians[name]:7.2f} ({p90[name]:6.2f}){overhead}")


async def bench_tar(backends: dict[str, SandboxBackend], workspace: Path, runs: int) -> None:
    size = await anyio.to_thread.run_sync(make_big_workspace, workspace)
    for backend in backends.values():
        await backend.prepare_workspace(workspace)
    # The new files' writeback would otherwise compete with the first rounds.
    await anyio.to_thread.run_sync(os.sync)
    names = ["direct", "setsid", "anyio", *backends]
    timings: dict[str, list[float]] = {name: [] for name in names}
    streaming: dict[str, list[float]] = {name: [] for name in names}
    shuffle = random.Random(3)
    for round_number in range(runs + 1):
        # A fresh order each round, and a pause before each run: tearing down a sandbox
        # (network and mount namespaces, cgroups) finishes in kernel workers after `exec`
        # returns, and would otherwise always slow down whichever run comes next. Round 0
        # is not counted: it warms every path (dentries, the fork servers) alike.
        for name in shuffle.sample(names, len(names)):
            await anyio.sleep(SETTLE_S)
            sink = Counter()
            started = time.perf_counter()
            if name == "direct":
                await direct("tar -cf - .", workspace, sink)
            elif name == "setsid":
                await direct("tar -cf - .", workspace, sink, new_session=True)
            elif name == "anyio":
                await direct_anyio("tar -cf - .", workspace, sink)
            else:
                await sandboxed(backends[name], "tar -cf - .", workspace, sink)
            elapsed = time.perf_counter() - started
            if sink.total < size:
                raise SystemExit(f"{name} tar produced only {sink.total} bytes")
            if round_number:
                timings[name].append(elapsed)
                streaming[name].append(sink.last - sink.first)
    print(
        f"tar of a {size / MIB:.0f} MiB workspace x{runs}, medians; end to end (start to exit) "
        "and streaming alone (first to last chunk) (target inside/outside >= 0.90):"
    )
    for name in names:
        seconds = statistics.median(timings[name])
        ratio = statistics.median(timings["direct"]) / seconds
        stream_s = statistics.median(streaming[name])
        stream_ratio = statistics.median(streaming["direct"]) / stream_s
        print(
            f"  {name:17s} {seconds:6.3f} s  {size / MIB / seconds:6.1f} MiB/s  ratio {ratio:.2f}"
            f"   streaming {stream_s:6.3f} s  {size / MIB / stream_s:6.1f} MiB/s"
            f"  ratio {stream_ratio:.2f}"
        )


def working_backends(names: list[str]) -> dict[str, SandboxBackend]:
    backends = {}
    for name in names:
        try:
            if name == PER_COMMAND_BWRAP:
                backends[name] = detect_bwrap(session_containers=False)
            else:
                backends[name] = select_backend(name)
        except SandboxError as exc:
            print(f"{name}: does not work on this host: {exc.message}")
            continue
        print(f"{name}: {backends[name].isolation.get('containers', 'own launcher')}")
        print(f"{name} limits in force:", dict(backends[name].limits_in_force))
    return backends


async def main(runs: int, first_runs: int, tar_runs: int, names: list[str]) -> None:
    backends = working_backends(names)
    root = Path(tempfile.mkdtemp(prefix="cairn-bench-"))
    root.chmod(0o711)
    try:
        small = root / "small"
        small.mkdir()
        for backend in backends.values():
            await backend.prepare_workspace(small)
        await bench_overhead(backends, small, runs)
        if first_runs:
            await bench_first_command(backends, root, first_runs)
        if tar_runs:
            big = root / "big"
            big.mkdir()
            await bench_tar(backends, big, tar_runs)
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--first-runs", type=int, default=20)
    parser.add_argument("--tar-runs", type=int, default=11)
    parser.add_argument(
        "--backends",
        default=",".join(["bwrap", PER_COMMAND_BWRAP, *(n for n in ISOLATING_BACKENDS if n != "bwrap")]),
    )
    arguments = parser.parse_args()
    anyio.run(
        main, arguments.runs, arguments.first_runs, arguments.tar_runs,
        arguments.backends.split(","),
    )
