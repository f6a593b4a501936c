"""The session-container registry on its own: leases, races between starts, replacement,
retirement and reaping, with stand-in containers (a sleeping monitor and init) instead of
bwrap. bwrap's real containers are tested in test_bwrap_sessions.py."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import anyio
import pytest

from cairn.errors import SandboxError
from cairn.sandbox._env import DEFAULT_PATH
from cairn.sandbox._forkserver import ForkServer
from cairn.sandbox._session_containers import ContainerKey, SessionContainer, SessionContainers
from cairn.sandbox._workspace import WorkspaceIdentity
from cairn.sandbox.testing import host_processes_with
from tests.waits import until

pytestmark = pytest.mark.anyio

KEY = ContainerKey(workspace="/nowhere", network=False)
OTHER_KEY = ContainerKey(workspace="/elsewhere", network=False)
IDENTITY: WorkspaceIdentity = (1, 2)


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"debug": True})


class StandIns:
    """Starts stand-in containers whose processes carry a marker, and counts the starts."""

    def __init__(self, *, init_exits: bool = False, delay_s: float = 0.0) -> None:
        self.marker = f"cairn-stand-in-{uuid.uuid4().hex}"
        self.starts = 0
        self.inits: list[subprocess.Popen[bytes]] = []
        self._forks = ForkServer()
        self._init_exits = init_exits
        self._delay_s = delay_s

    def __call__(self, key: ContainerKey, identity: WorkspaceIdentity) -> SessionContainer:
        self.starts += 1
        time.sleep(self._delay_s)  # a blocking start, as bwrap's is
        monitor = self._forks.start({
            "argv": ["/bin/sh", "-c", f"echo ready; sleep 600; : {self.marker}"],
            "env": {"PATH": DEFAULT_PATH}, "cwd": "/", "workspace": "/", "cgroup_join": [],
            "rlimits": [], "user": None, "network": True, "seccomp": False, "files": [],
            "rootfs": None, "landlock": None, "join": None,
        })
        monitor.output_blocking(b"ready\n", 10)
        script = "exit 0" if self._init_exits else f"sleep 600; : {self.marker}"
        init = subprocess.Popen(["sh", "-c", script])
        self.inits.append(init)
        pidfd = os.pidfd_open(init.pid)
        if self._init_exits:
            init.wait()
        return SessionContainer(monitor, pidfd, identity)

    def running(self) -> int:
        return len(host_processes_with(self.marker))

    async def until_running(self, processes: int, what: str) -> None:
        await until(lambda: self.running() == processes, what, seen=lambda: f"{self.running()} processes running")


@pytest.fixture
def stand_ins() -> Iterator[Callable[..., StandIns]]:
    made: list[StandIns] = []

    def make(**options: float | bool) -> StandIns:
        made.append(StandIns(**options))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for start in made:
        for init in start.inits:
            init.kill()  # a no-op for those the registry killed already
            init.wait()


async def test_two_first_commands_at_once_share_one_container(stand_ins: Callable[..., StandIns]) -> None:
    start = stand_ins(delay_s=0.2)
    registry = SessionContainers(start, idle_s=300, max_age_s=3600)
    pidfds: list[int] = []
    both_hold_a_lease = anyio.Event()

    async def command() -> None:
        async with registry.lease(KEY, IDENTITY) as pidfd:
            pidfds.append(pidfd)
            if len(pidfds) == 2:
                both_hold_a_lease.set()
            await both_hold_a_lease.wait()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(command)
            tg.start_soon(command)
    assert start.starts == 2 and pidfds[0] == pidfds[1]  # the second start was discarded
    await start.until_running(2, "one container: its monitor and init")
    registry.release(KEY.workspace)
    await start.until_running(0, "the released container to end")


async def test_a_container_that_dies_at_once_is_not_started_forever(stand_ins: Callable[..., StandIns]) -> None:
    start = stand_ins(init_exits=True)
    registry = SessionContainers(start, idle_s=300, max_age_s=3600)
    with pytest.raises(SandboxError, match="ended each time it was started"):
        async with registry.lease(KEY, IDENTITY):
            pass
    assert start.starts == 2
    await start.until_running(0, "both short-lived containers to be gone")


async def test_a_replaced_container_lives_until_its_last_command_ends(stand_ins: Callable[..., StandIns]) -> None:
    """A workspace made again gets a new container; a command still running in the old one
    keeps it until it ends."""
    start = stand_ins()
    registry = SessionContainers(start, idle_s=300, max_age_s=3600)
    async with registry.lease(KEY, IDENTITY) as old:
        async with registry.lease(KEY, (1, 3)) as new:
            assert new != old and start.starts == 2
            assert start.running() == 4
        await start.until_running(4, "the old container to run on under its lease")
    await start.until_running(2, "the old container to go with its last lease")
    registry.release(KEY.workspace)
    await start.until_running(0, "the released container to end")


async def test_an_idle_container_is_reaped_but_a_leased_one_is_not(stand_ins: Callable[..., StandIns]) -> None:
    start = stand_ins()
    registry = SessionContainers(start, idle_s=0.2, max_age_s=3600)
    async with registry.lease(KEY, IDENTITY) as leased:
        async with registry.lease(OTHER_KEY, IDENTITY):
            pass
        # The pass that reaps the idle one finds the leased one, started earlier, past its idle time too.
        await until(lambda: start.inits[1].poll() is not None, "the idle container to be reaped")
        async with registry.lease(KEY, IDENTITY) as again:
            assert again == leased and start.starts == 2
    await start.until_running(0, "the container to be reaped once idle")
    async with registry.lease(KEY, IDENTITY):
        assert start.starts == 3


async def test_a_container_past_its_maximum_age_is_replaced_after_its_last_command(
    stand_ins: Callable[..., StandIns],
) -> None:
    """A busy session keeps getting commands, so idling never replaces its container: age does."""
    start = stand_ins()
    registry = SessionContainers(start, idle_s=300, max_age_s=1.0)
    async with registry.lease(KEY, IDENTITY) as first:
        async with registry.lease(KEY, IDENTITY) as young:
            assert young == first and start.starts == 1  # not old yet: joined
        await until(lambda: not registry._pool.has_usable(KEY, IDENTITY), "the container to pass its maximum age")
        async with registry.lease(KEY, IDENTITY) as fresh:
            assert fresh != first and start.starts == 2
            # The old one still runs the first command. Waited for, not sampled: a shell's forked
            # child carries the marker until it execs `sleep`, so a sample may count it too.
            await start.until_running(4, "both containers to run, the old one with its command")
    await start.until_running(2, "the old container to go with its last lease")
    async with registry.lease(KEY, IDENTITY) as again:
        assert again == fresh and start.starts == 2
    registry.release(KEY.workspace)
    await start.until_running(0, "the released container to end")


async def test_a_dropped_registry_kills_its_containers_and_refuses_leases(stand_ins: Callable[..., StandIns]) -> None:
    start = stand_ins()
    registry = SessionContainers(start, idle_s=300, max_age_s=3600)
    async with registry.lease(KEY, IDENTITY):
        pass
    pool = registry._pool
    del registry
    await start.until_running(0, "the dropped registry's container to end")
    with pytest.raises(SandboxError, match="shut down"):
        pool.lease(KEY, IDENTITY)
