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

pytestmark = pytest.mark.anyio

KEY = ContainerKey(workspace="/nowhere", network=False)
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


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    with anyio.fail_after(timeout_s):
        while not condition():
            await anyio.sleep(0.02)


async def test_two_first_commands_at_once_share_one_container(stand_ins: Callable[..., StandIns]) -> None:
    start = stand_ins(delay_s=0.2)
    registry = SessionContainers(start, idle_s=300, max_age_s=3600)
    pidfds: list[int] = []

    async def command() -> None:
        async with registry.lease(KEY, IDENTITY) as pidfd:
            pidfds.append(pidfd)
            await anyio.sleep(0.3)

    async with anyio.create_task_group() as tg:
        tg.start_soon(command)
        tg.start_soon(command)
    assert start.starts == 2 and pidfds[0] == pidfds[1]  # the second start was discarded
    await until(lambda: start.running() == 2)  # one container: its monitor and init
    registry.release(KEY.workspace)
    await until(lambda: start.running() == 0)


async def test_a_container_that_dies_at_once_is_not_started_forever(stand_ins: Callable[..., StandIns]) -> None:
    start = stand_ins(init_exits=True)
    registry = SessionContainers(start, idle_s=300, max_age_s=3600)
    with pytest.raises(SandboxError, match="ended each time it was started"):
        async with registry.lease(KEY, IDENTITY):
            pass
    assert start.starts == 2
    await until(lambda: start.running() == 0)


async def test_a_replaced_container_lives_until_its_last_command_ends(stand_ins: Callable[..., StandIns]) -> None:
    """A workspace made again gets a new container; a command still running in the old one
    keeps it until it ends."""
    start = stand_ins()
    registry = SessionContainers(start, idle_s=300, max_age_s=3600)
    async with registry.lease(KEY, IDENTITY) as old:
        async with registry.lease(KEY, (1, 3)) as new:
            assert new != old and start.starts == 2
            assert start.running() == 4
        await until(lambda: start.running() == 4)
    await until(lambda: start.running() == 2)  # the old one went with its last lease
    registry.release(KEY.workspace)
    await until(lambda: start.running() == 0)


async def test_an_idle_container_is_reaped_but_a_leased_one_is_not(stand_ins: Callable[..., StandIns]) -> None:
    start = stand_ins()
    registry = SessionContainers(start, idle_s=0.2, max_age_s=3600)
    async with registry.lease(KEY, IDENTITY):
        await anyio.sleep(0.5)
        assert start.running() == 2
    await until(lambda: start.running() == 0)
    async with registry.lease(KEY, IDENTITY):
        assert start.starts == 2


async def test_a_container_past_its_maximum_age_is_replaced_after_its_last_command(
    stand_ins: Callable[..., StandIns],
) -> None:
    """A busy session keeps getting commands, so idling never replaces its container: age does."""
    start = stand_ins()
    registry = SessionContainers(start, idle_s=300, max_age_s=1.0)
    async with registry.lease(KEY, IDENTITY) as first:
        async with registry.lease(KEY, IDENTITY) as young:
            assert young == first and start.starts == 1  # not old yet: joined
        await anyio.sleep(1.1)
        async with registry.lease(KEY, IDENTITY) as fresh:
            assert fresh != first and start.starts == 2
            assert start.running() == 4  # the old one still runs the first command
    await until(lambda: start.running() == 2)  # the old one went with its last lease
    async with registry.lease(KEY, IDENTITY) as again:
        assert again == fresh and start.starts == 2
    registry.release(KEY.workspace)
    await until(lambda: start.running() == 0)


async def test_a_dropped_registry_kills_its_containers_and_refuses_leases(stand_ins: Callable[..., StandIns]) -> None:
    start = stand_ins()
    registry = SessionContainers(start, idle_s=300, max_age_s=3600)
    async with registry.lease(KEY, IDENTITY):
        pass
    pool = registry._pool
    del registry
    await until(lambda: start.running() == 0)
    with pytest.raises(SandboxError, match="shut down"):
        pool.lease(KEY, IDENTITY)
