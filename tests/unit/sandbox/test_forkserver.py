"""The fork server: one command per request, failures reported, nothing outlives it, and a
joining command forked into its container's pid namespace and no other."""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cairn.errors import SandboxError
from cairn.sandbox._env import DEFAULT_PATH
from cairn.sandbox._forkserver import ForkServer
from cairn.sandbox._launcher.main import LAUNCH_FAILED
from cairn.sandbox.testing import host_processes_with
from tests.waits import until, until_blocking

if TYPE_CHECKING:
    from cairn.sandbox._launcher.spec import LaunchSpec

pytestmark = pytest.mark.anyio


def plain(command: str) -> LaunchSpec:
    """A spec with no confinement at all: the fork server's own mechanics only."""
    return {
        "argv": ["/bin/sh", "-c", command], "env": {"PATH": DEFAULT_PATH}, "cwd": "/",
        "workspace": "/", "cgroup_join": [], "rlimits": [], "user": None, "network": True,
        "seccomp": False, "files": [], "rootfs": None, "landlock": None, "join": None,
    }


async def test_output_and_status_of_a_command() -> None:
    command = ForkServer().start(plain("echo out; echo err >&2; exit 3"))
    try:
        await command.started()
        output = b"".join([chunk async for chunk in command.output()])
        assert await command.wait() == 3
    finally:
        command.close()
    assert output == b"out\nerr\n"


def test_a_launch_failure_says_why() -> None:
    spec = plain("true")
    spec["cwd"] = "/does/not/exist"
    command = ForkServer().start(spec)
    try:
        status, output = command.run_blocking(10)
    finally:
        command.close()
    assert status == LAUNCH_FAILED
    assert b"cairn sandbox launcher:" in output and b"/does/not/exist" in output


async def test_commands_die_with_their_fork_server() -> None:
    marker = f"cairn-forkserver-{uuid.uuid4().hex}"
    forks = ForkServer()
    command = forks.start(plain(f"sleep 600; : {marker}"))
    await command.started()
    await until(lambda: host_processes_with(marker), "the command to exec")  # started: forked, maybe not exec'd yet
    command.close()
    del forks, command  # a command handle keeps its fork server alive
    gc.collect()  # the server's end of the control socket closes: the fork server kills
    await until(lambda: not host_processes_with(marker), "the command to die with its fork server", seen=lambda: host_processes_with(marker))


async def test_files_are_handed_to_the_program_by_number(tmp_path: Path) -> None:
    host_file = tmp_path / "host.txt"
    host_file.write_text("from the host\n")
    spec = plain("cat <&10; cat <&11; cat <&12; echo end; ls /proc/self/fd")
    spec["argv"][0] = "/bin/bash"  # dash reads only single-digit descriptors
    spec["files"] = [(10, str(host_file)), (11, b"given content\n"), (12, str(tmp_path / "gone"))]
    command = ForkServer().start(spec)
    try:
        await command.started()
        output = b"".join([chunk async for chunk in command.output()]).decode()
        assert await command.wait() == 0
    finally:
        command.close()
    text, _, descriptors = output.partition("end\n")
    assert text == "from the host\ngiven content\n"  # a missing file reads as empty
    assert {"10", "11", "12"} <= set(descriptors.split())


@pytest.fixture
def pid_namespace() -> Iterator[tuple[int, str]]:
    """A stand-in container: a process alone in a new pid namespace (pidfd, namespace)."""
    holder = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sleep", "600"])
    try:
        children = until_blocking(
            lambda: Path(f"/proc/{holder.pid}/task/{holder.pid}/children").read_text().split(), "unshare to start its child"
        )
        inner = int(children[0])
        pidfd = os.pidfd_open(inner)
        try:
            yield pidfd, os.readlink(f"/proc/{inner}/ns/pid")
        finally:
            os.close(pidfd)
    finally:
        holder.kill()
        holder.wait()


async def output_of(forks: ForkServer, spec: LaunchSpec, pidfd: int | None = None) -> tuple[str, int]:
    command = forks.start(spec, pidfd, joins=pidfd is not None)
    try:
        await command.started()
        output = b"".join([chunk async for chunk in command.output()]).decode()
        return output, await command.wait()
    finally:
        command.close()


async def test_a_joining_command_is_forked_into_the_pid_namespace_and_no_other(
    pid_namespace: tuple[int, str],
) -> None:
    pidfd, namespace = pid_namespace
    forks = ForkServer()
    own = os.readlink("/proc/self/ns/pid")
    joined, _ = await output_of(forks, plain("readlink /proc/self/ns/pid"), pidfd)
    after, _ = await output_of(forks, plain("readlink /proc/self/ns/pid"))
    assert (joined.strip(), after.strip()) == (namespace, own)
    # A joining command's status is relayed as a shell reports it: 128 + signal.
    assert (await output_of(forks, plain("kill -9 $$"), pidfd))[1] == 128 + signal.SIGKILL
    assert (await output_of(forks, plain("kill -9 $$")))[1] == -signal.SIGKILL


async def test_a_join_into_a_gone_process_is_refused() -> None:
    gone = subprocess.Popen(["true"])
    pidfd = os.pidfd_open(gone.pid)
    gone.wait()
    command = ForkServer().start(plain("echo ran"), pidfd, joins=True)
    try:
        for _ in range(2):  # the same error each time, not "the fork server went away"
            with pytest.raises(SandboxError, match="could not start the command: No such process"):
                await command.started()
    finally:
        command.close()
        os.close(pidfd)


async def test_two_passed_descriptors_arrive_in_order() -> None:
    first, first_theirs = socket.socketpair()
    second, second_theirs = socket.socketpair()
    with first, first_theirs, second, second_theirs:
        command = ForkServer().start(plain("echo one >&4; echo two >&5"), first_theirs.fileno(), next_fd=second_theirs.fileno())
        try:
            await command.started()
            assert await command.wait() == 0
        finally:
            command.close()
        assert (first.recv(16), second.recv(16)) == (b"one\n", b"two\n")
