"""bwrap session containers: one per session workspace and network setting, joined by every
command, reaped when idle, replaced when killed, gone with the server; and what a joined
command can reach. Real bwrap and real processes; every check is made on the host.

The conformance and escape suites (tests/conformance/sandbox/) run unchanged against this
form as `bwrap`; these are the cases only a long-lived container has.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path

import anyio
import pytest

from cairn.errors import SandboxError
from cairn.sandbox import ExecRequest, ExecResult, testing
from cairn.sandbox._cgroups import CgroupHost
from cairn.sandbox.bwrap import PER_COMMAND, BwrapBackend
from cairn.sandbox.bwrap_sessions import SessionBwrapBackend, detect_bwrap
from cairn.sandbox.doctor import describe_host
from cairn.sandbox.egress import NetworkPolicy, SessionEgress
from cairn.sandbox.testing import host_processes_with
from tests.waits import until

pytestmark = pytest.mark.anyio

IDLE_S = 0.5


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"debug": True})


def session_backend(idle_s: float = 300.0) -> BwrapBackend:
    try:
        return detect_bwrap(session_containers=True, idle_s=idle_s)
    except SandboxError as exc:
        pytest.skip(f"bwrap session containers do not work on this host: {exc.message}")


@pytest.fixture(scope="module")
def backend() -> BwrapBackend:
    return session_backend()


@pytest.fixture(scope="module")
def workspace_root() -> Iterator[Path]:
    with testing.workspace_root("cairn-bwrap-sessions-") as root:
        yield root


@pytest.fixture
def new_workspace(workspace_root: Path, backend: BwrapBackend) -> Callable[[], Awaitable[Path]]:
    return partial(testing.new_workspace, workspace_root, backend)


async def run(
    backend: BwrapBackend, command: str, workspace: Path, *, network: bool = False,
    timeout_s: float = 20.0,
) -> tuple[ExecResult, str]:
    chunks: list[bytes] = []

    async def collect(chunk: bytes) -> None:
        chunks.append(chunk)

    egress = SessionEgress("sess_bwrap_sessions", NetworkPolicy("enabled")) if network else None
    request = ExecRequest(command=command, workspace=workspace, timeout_s=timeout_s, egress=egress)
    result = await backend.exec(request, collect)
    return result, b"".join(chunks).decode(errors="replace")


def container_processes(workspace: Path) -> list[int]:
    """Host pids of the bwrap processes (monitor and init) of `workspace`'s containers."""
    return host_processes_with(f"{workspace}\0/workspace\0")


async def until_no_container(workspace: Path) -> None:
    await until(
        lambda: not container_processes(workspace), "the workspace's container to end", seen=lambda: container_processes(workspace)
    )


def test_the_default_bwrap_backend_keeps_session_containers(backend: BwrapBackend) -> None:
    assert isinstance(backend, SessionBwrapBackend)
    assert "per session workspace" in backend.isolation["containers"]
    assert backend.limits_in_force["background_processes"].startswith("found through the command's cgroup")
    assert "per session workspace" in describe_host("bwrap")


async def test_commands_of_a_workspace_share_one_container(backend: BwrapBackend, new_workspace) -> None:
    workspace = await new_workspace()
    first, _ = await run(backend, "echo kept > /tmp/kept", workspace)
    processes = container_processes(workspace)
    assert first.exit_code == 0 and len(processes) == 2  # bwrap's monitor and its init
    second, output = await run(backend, "cat /tmp/kept; pwd; id -u", workspace)
    assert (second.exit_code, output) == (0, "kept\n/workspace\n1000\n")
    assert container_processes(workspace) == processes


async def test_each_network_setting_has_its_own_container(backend: BwrapBackend, new_workspace) -> None:
    workspace = await new_workspace()
    await run(backend, "echo offline > /tmp/which", workspace)
    _, online = await run(backend, "cat /tmp/which 2>&1; echo online > /tmp/which", workspace, network=True)
    _, offline = await run(backend, "cat /tmp/which", workspace)
    assert "No such file" in online and offline == "offline\n"
    assert len(container_processes(workspace)) == 4


async def test_an_idle_container_is_reaped(workspace_root: Path) -> None:
    backend = session_backend(idle_s=IDLE_S)
    workspace = await testing.new_workspace(workspace_root, backend)
    await run(backend, "echo kept > /tmp/kept", workspace)
    assert container_processes(workspace)
    await until_no_container(workspace)
    result, output = await run(backend, "cat /tmp/kept 2>&1 || echo fresh", workspace)
    assert result.exit_code == 0 and output.endswith("fresh\n")


async def test_a_running_command_keeps_its_container_past_the_idle_time(workspace_root: Path) -> None:
    backend = session_backend(idle_s=IDLE_S)
    workspace = await testing.new_workspace(workspace_root, backend)
    result, output = await run(backend, f"sleep {IDLE_S * 4}; echo survived", workspace)
    assert (result.exit_code, output) == (0, "survived\n")


async def test_a_killed_container_is_replaced(backend: BwrapBackend, new_workspace) -> None:
    workspace = await new_workspace()
    await run(backend, "echo kept > /tmp/kept", workspace)
    killed = container_processes(workspace)
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    await until(lambda: not set(killed) & set(container_processes(workspace)), "the killed processes to be gone")
    result, output = await run(backend, "cat /tmp/kept 2>&1 || echo fresh", workspace)
    assert result.exit_code == 0 and output.endswith("fresh\n")
    replacement = container_processes(workspace)
    assert len(replacement) == 2 and not set(replacement) & set(killed)


async def test_a_command_dies_with_its_container(backend: BwrapBackend, new_workspace) -> None:
    marker = f"cairn-doomed-{uuid.uuid4().hex}"
    workspace = await new_workspace()
    await run(backend, "true", workspace)
    outcome: list[ExecResult] = []

    async def doomed() -> None:
        outcome.append((await run(backend, f"sh -c 'sleep 600; : {marker}'", workspace))[0])

    async with anyio.create_task_group() as tg:
        tg.start_soon(doomed)
        await until(lambda: host_processes_with(marker), "the command to start")
        for pid in container_processes(workspace):
            os.kill(pid, signal.SIGKILL)
    assert outcome[0].exit_code == 128 + signal.SIGKILL
    assert host_processes_with(marker) == []


async def test_sessions_have_separate_containers(backend: BwrapBackend, new_workspace) -> None:
    marker = f"cairn-other-{uuid.uuid4().hex}"
    first, second = await new_workspace(), await new_workspace()
    async with anyio.create_task_group() as tg:
        tg.start_soon(run, backend, f"echo mine > /tmp/{marker}; sh -c 'sleep 600; : {marker}'", first)
        await until(lambda: host_processes_with(marker), "the command to start")
        pattern = f"cairn-othe[r]-{marker.rsplit('-', 1)[1]}"
        _, output = await run(
            backend, f"ls /tmp; grep -l '{pattern}' /proc/*/cmdline; ls /proc | grep -c '^[0-9]'", second
        )
        tg.cancel_scope.cancel()
    assert marker not in output
    assert int(output.split()[-1]) < 6  # bwrap's reaper, the init, and this command
    assert not set(container_processes(first)) & set(container_processes(second))


async def test_background_processes_end_with_their_command(backend: BwrapBackend, new_workspace) -> None:
    marker = f"cairn-left-{uuid.uuid4().hex}"
    workspace = await new_workspace()
    lingering = f"sh -c 'sleep 600; : {marker}'"
    result, _ = await run(
        backend, f"{lingering} > /dev/null 2>&1 & setsid {lingering} > /dev/null 2>&1 & echo started",
        workspace,
    )
    assert result.exit_code == 0
    assert host_processes_with(marker) == []
    # Inside, the next command lists only itself (the container's own two are hidden).
    _, output = await run(
        backend, "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done", workspace
    )
    assert output.splitlines() == ["/bin/sh -c for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done "]


async def test_the_container_init_is_out_of_reach(backend: BwrapBackend, new_workspace) -> None:
    """A command cannot trace, read the memory of or signal bwrap's reaper (pid 1) or the
    init (pid 2): they outlive it, outside its cgroups."""
    workspace = await new_workspace()
    await run(backend, "echo kept > /tmp/kept", workspace)
    before = container_processes(workspace)
    (workspace / "reach.py").write_text(textwrap.dedent("""\
        import ctypes, os, signal
        libc = ctypes.CDLL(None, use_errno=True)
        print("listed", sorted(name for name in os.listdir("/proc") if name.isdigit()))
        for pid in (1, 2):
            attached = libc.ptrace(16, pid, 0, 0)  # PTRACE_ATTACH
            print(pid, "attach", attached, os.strerror(ctypes.get_errno()))
            for name in ("mem", "environ", "fd/0"):
                try:
                    open(f"/proc/{pid}/{name}", "rb").close()
                    print(pid, name, "OPENED")
                except OSError as error:
                    print(pid, name, error.strerror)
            for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):
                try:
                    os.kill(pid, sig)
                    print(pid, sig, "SENT")
                except OSError as error:
                    print(pid, sig, error.strerror)
    """))
    _, output = await run(backend, "python3 reach.py; kill -9 -1; echo done", workspace)
    assert "attach -1 Operation not permitted" in output and "attach 0" not in output
    assert "OPENED" not in output and "SENT" not in output
    listed = output.split("listed ", 1)[1].split("\n", 1)[0]
    assert "'1'" not in listed and "'2'" not in listed  # hidden as well
    result, after = await run(backend, "cat /tmp/kept", workspace)
    assert (result.exit_code, after) == (0, "kept\n")
    assert container_processes(workspace) == before


def pid_inside(host_pid: int) -> int:
    """`host_pid`'s number in its own (innermost) pid namespace."""
    status = Path(f"/proc/{host_pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[-1])


def is_sleeping_under(parents: list[int]) -> bool:
    """Whether one of `parents` has a child that already runs `sleep`."""
    for parent in parents:
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except FileNotFoundError:
            continue
        for child in children:
            try:
                if Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep\0"):
                    return True
            except FileNotFoundError:
                continue
    return False


async def test_concurrent_commands_cannot_see_or_reach_each_other(
    backend: BwrapBackend, new_workspace
) -> None:
    marker = f"cairn-sibling-{uuid.uuid4().hex}"
    workspace = await new_workspace()
    async with anyio.create_task_group() as tg:
        tg.start_soon(run, backend, f"sh -c 'sleep 600; : {marker}'", workspace)
        # Sampled once `sleep` runs: until it execs, the shell's forked child still carries
        # the marker in its command line and would be counted, then vanish on its own.
        await until(lambda: is_sleeping_under(host_processes_with(marker)), "the command's sleep to run")
        sibling = host_processes_with(marker)
        pattern = f"cairn-siblin[g]-{marker.rsplit('-', 1)[1]}"
        command = (
            f"grep -l '{pattern}' /proc/[0-9]*/cmdline || echo unlisted; "
            f"for pid in {' '.join(str(pid_inside(pid)) for pid in sibling)}; do "
            "kill -9 $pid || echo refused; "
            "python3 -c \"import ctypes,sys; print('attach', ctypes.CDLL(None).ptrace(16, int(sys.argv[1]), 0, 0))\" $pid; "
            "done"
        )
        _, output = await run(backend, command, workspace)
        survived = host_processes_with(marker)
        tg.cancel_scope.cancel()
    assert "unlisted" in output
    assert output.count("refused") == len(sibling) and output.count("attach -1") == len(sibling)
    assert sorted(survived) == sorted(sibling)


async def test_nested_user_namespaces_are_refused(backend: BwrapBackend, new_workspace) -> None:
    workspace = await new_workspace()
    _, output = await run(
        backend, "unshare -U true && echo USERNS; unshare -Ur true && echo ROOTNS; "
        "python3 -c 'import os; os.unshare(os.CLONE_NEWUSER); print(\"PY-USERNS\")'", workspace
    )
    assert "USERNS" not in output and "ROOTNS" not in output and "PY-USERNS" not in output
    assert "No space left on device" in output  # bwrap's --disable-userns holds for joined processes


async def test_nothing_of_the_host_leaks_through_the_join(backend: BwrapBackend, new_workspace) -> None:
    """Descriptors, working directory, root, credentials, cgroup paths and the tree are the
    container's; the launcher brought nothing of the host's in (the environment is checked
    by the conformance suite)."""
    workspace = await new_workspace()
    _, output = await run(
        backend,
        "echo fds $(ls /proc/self/fd); echo at $(readlink /proc/self/cwd /proc/self/root); "
        "echo parent $PPID; grep -E '^(NoNewPrivs|CapBnd|CapEff|CapPrm|Seccomp):' /proc/self/status; "
        "echo cgroups $(cut -d: -f3 /proc/self/cgroup | sort -u); echo tree $(ls /)",
        workspace,
    )
    fields = {line.split()[0].rstrip(":"): line.split()[1:] for line in output.splitlines()}
    assert fields["fds"] == ["0", "1", "2", "3"]  # 3 is the directory `ls` lists
    assert fields["at"] == ["/workspace", "/"]
    assert fields["parent"] == ["0"]  # the launcher that forked it waits outside the pid namespace
    assert fields["NoNewPrivs"] == ["1"] and fields["Seccomp"] == ["0"]
    for caps in ("CapBnd", "CapEff", "CapPrm"):
        assert fields[caps] == ["0000000000000000"]
    assert fields["cgroups"] == ["/"]  # a cgroup namespace rooted at the command's leaves
    assert set(fields["tree"]) <= {
        "bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr", "workspace",
    }


async def test_ipc_objects_are_the_commands_own(backend: BwrapBackend, new_workspace) -> None:
    workspace = await new_workspace()
    created, _ = await run(backend, "ipcmk -M 65536 && ipcs -m | grep -c 0x", workspace)
    _, output = await run(backend, "ipcs -m | grep -c 0x || true", workspace)
    assert created.exit_code == 0 and output == "0\n"


async def test_only_bounded_tmpfs_is_writable(backend: BwrapBackend, new_workspace) -> None:
    workspace = await new_workspace()
    _, output = await run(
        backend, "touch /dev/cairn 2>&1; touch /cairn 2>&1; df -k /tmp /dev/shm | tail -2", workspace
    )
    assert output.count("Read-only file system") == 2
    sizes = [int(line.split()[1]) for line in output.splitlines()[-2:]]
    assert sizes == [1024 * 1024, 64 * 1024]  # KiB: 1 GiB /tmp, 64 MiB /dev/shm


async def test_a_workspace_made_again_gets_a_new_container(
    backend: BwrapBackend, new_workspace
) -> None:
    workspace = await new_workspace()
    await run(backend, "echo old > old.txt", workspace)
    shutil.rmtree(workspace)
    workspace.mkdir()
    (workspace / "new.txt").write_text("new\n")
    await backend.prepare_workspace(workspace)
    _, output = await run(backend, "ls", workspace)
    assert output == "new.txt\n"
    assert len(container_processes(workspace)) == 2


async def test_releasing_a_workspace_kills_its_containers(backend: BwrapBackend, new_workspace) -> None:
    workspace = await new_workspace()
    await run(backend, "echo kept > /tmp/kept", workspace)
    await run(backend, "true", workspace, network=True)
    assert len(container_processes(workspace)) == 4
    await backend.release_workspace(workspace)
    await until_no_container(workspace)
    _, output = await run(backend, "cat /tmp/kept 2>&1 || echo fresh", workspace)
    assert output.endswith("fresh\n")


async def test_dropping_the_backend_kills_its_containers(new_workspace) -> None:
    dropped = session_backend()
    workspace = await new_workspace()
    await run(dropped, "true", workspace)
    assert container_processes(workspace)
    del dropped
    gc.collect()
    await until_no_container(workspace)


SERVER = """\
import anyio, os, sys, time
from pathlib import Path
from cairn.sandbox import ExecRequest
from cairn.sandbox.bwrap_sessions import detect_bwrap

async def main() -> None:
    backend = detect_bwrap(session_containers=True)
    async def ignore(chunk: bytes) -> None:
        pass
    await backend.exec(ExecRequest(command="true", workspace=Path(sys.argv[1]), timeout_s=20), ignore)
    print(backend._forks._process.pid, flush=True)
    time.sleep(600)

anyio.run(main)
"""


@pytest.mark.parametrize("also_kill_fork_server", [False, True], ids=["server", "server-and-fork-server"])
async def test_no_container_outlives_the_server(new_workspace, also_kill_fork_server: bool) -> None:
    workspace = await new_workspace()
    with subprocess.Popen(
        [sys.executable, "-c", SERVER, str(workspace)], stdout=subprocess.PIPE, text=True
    ) as server:
        try:
            assert server.stdout is not None
            fork_server = int(await anyio.to_thread.run_sync(server.stdout.readline))
            assert len(container_processes(workspace)) == 2
            server.kill()
            if also_kill_fork_server:
                os.kill(fork_server, signal.SIGKILL)
            await until_no_container(workspace)
        finally:
            server.kill()


def test_without_cgroups_each_command_gets_its_own_container(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cairn.sandbox.bwrap_sessions.discover_cgroups", CgroupHost)
    try:
        fallback = detect_bwrap()
    except SandboxError as exc:
        pytest.skip(f"bwrap does not work on this host: {exc.message}")
    assert type(fallback) is BwrapBackend
    assert fallback.isolation["containers"].startswith(PER_COMMAND)
    assert "no writable cgroup" in fallback.isolation["containers"]
    with pytest.raises(SandboxError, match="no writable cgroup"):
        detect_bwrap(session_containers=True)


def test_without_landlock_scoping_each_command_gets_its_own_container(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("cairn.sandbox.bwrap_sessions.abi_version", lambda: 5)
    try:
        fallback = detect_bwrap()
    except SandboxError as exc:
        pytest.skip(f"bwrap does not work on this host: {exc.message}")
    assert type(fallback) is BwrapBackend
    assert "Landlock ABI 5" in fallback.isolation["containers"]
