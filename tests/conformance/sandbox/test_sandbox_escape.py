"""The escape suite at the backend level: each case tries to get out, then the host checks.

Runs against every backend that declares the "isolation" capability (the unconfined backend
declares none, by design). Every case asserts on the host afterwards, not on what the
command claims, and then checks the next command in the same workspace still works.
What only a pid namespace gives (host processes invisible) is checked for backends that
declare "process_isolation" (the landlock backend does not: /proc lists host processes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from conftest import Run, requires_capability
from test_sandbox_exec import lingering

from cairn.errors import SandboxError
from cairn.sandbox import ResourceLimits, SandboxBackend
from cairn.sandbox.testing import LoopbackListeners, host_processes_with
from tests.waits import until

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024


@pytest.fixture(autouse=True)
def _isolating_only(backend: SandboxBackend) -> None:
    if "isolation" not in backend.capabilities:
        pytest.skip(f"backend {backend.name!r} does not declare the isolation capability")


@pytest.fixture
def host_dir(workspace_root: Path) -> Iterator[Path]:
    """A host directory next to the workspaces, holding a canary file."""
    path = workspace_root / f"host-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    (path / "canary.txt").write_text("host canary\n")
    yield path


async def assert_still_works(run: Run, workspace: Path) -> None:
    result, output = await run("echo still-works", workspace)
    assert (result.exit_code, output) == (0, "still-works\n")


async def test_writes_outside_the_workspace_do_not_reach_the_host(
    run: Run, new_workspace, host_dir: Path
) -> None:
    workspace = await new_workspace()
    name = f"escape-{uuid.uuid4().hex[:8]}"
    targets = [
        host_dir / "canary.txt", host_dir / name, workspace.parent / name,
        Path("/etc") / name, Path("/usr") / name, Path("/root") / name, Path("/") / name,
        Path("/var/tmp") / name, Path("/dev/shm") / name,
    ]
    attempts = "; ".join(f"echo pwned > {target}" for target in targets)
    relative = f"echo pwned > ../{name}; echo pwned > ../../{name}; (cd / && echo pwned > {name})"
    await run(f"{attempts}; {relative}; echo pwned > /workspace/../{name}", workspace)
    assert (host_dir / "canary.txt").read_text() == "host canary\n"
    for target in [*targets[1:], workspace.parent.parent / name]:
        assert not target.exists(), target
    await assert_still_works(run, workspace)


async def test_planted_symlinks_do_not_lead_out(
    backend: SandboxBackend, run: Run, new_workspace, host_dir: Path
) -> None:
    workspace = await new_workspace()
    (workspace / "file-link").symlink_to(host_dir / "canary.txt")
    (workspace / "dir-link").symlink_to(host_dir)
    (workspace / "shadow-link").symlink_to("/etc/shadow")
    (workspace / "usr-link").symlink_to("/usr/bin")
    command = (
        "cat file-link shadow-link; echo pwned > file-link; echo pwned > dir-link/new; "
        "echo pwned > usr-link/cairn-escape; ln -sf /etc/passwd made-link; echo pwned >> made-link"
    )
    _, output = await run(command, workspace)
    assert "host canary" not in output
    assert "root:" not in output.replace("cannot", "")
    assert (host_dir / "canary.txt").read_text() == "host canary\n"
    assert not (host_dir / "new").exists()
    assert not Path("/usr/bin/cairn-escape").exists()
    assert "pwned" not in Path("/etc/passwd").read_text()
    # Handing the workspace over again must not follow the links planted in it.
    await backend.prepare_workspace(workspace)
    assert (host_dir / "canary.txt").stat().st_uid == os.geteuid()
    assert Path("/etc/passwd").stat().st_uid == 0
    await assert_still_works(run, workspace)


async def test_remount_and_privilege_tricks_fail(run: Run, new_workspace) -> None:
    workspace = await new_workspace()
    name = f"escape-{uuid.uuid4().hex[:8]}"
    command = (
        "grep CapEff /proc/self/status; "
        f"mount -o remount,rw /usr && echo pwned > /usr/{name}; "
        f"mount -o remount,bind,rw /usr && echo pwned > /usr/{name}; "
        f"unshare -Urm sh -c 'mount -o remount,rw /usr && echo pwned > /usr/{name}'; "
        "unshare -Ur true && echo NESTED-USERNS-OK; "
        "mount -t tmpfs none /workspace && echo MOUNT-OK; "
        "su -c true root; true"
    )
    _, output = await run(command, workspace)
    assert "CapEff:\t0000000000000000" in output
    assert "NESTED-USERNS-OK" not in output
    assert "MOUNT-OK" not in output
    assert not Path(f"/usr/{name}").exists()
    await assert_still_works(run, workspace)


async def test_host_secrets_are_unreadable(
    backend: SandboxBackend, run: Run, new_workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"host-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("CAIRN_ESCAPE_SECRET", secret)
    workspace = await new_workspace()
    host_init = Path("/proc/1/cmdline").read_bytes().split(b"\0")[0].decode()
    command = (
        "cat /etc/shadow; env; cat /proc/1/environ /proc/1/cmdline; echo; "
        "cat /proc/*/environ; ls /home /root; cat /proc/self/mountinfo"
    )
    _, output = await run(command, workspace)
    assert secret not in output
    assert "root:*:" not in output and "root:!" not in output
    assert os.getcwd() not in output  # not even the server's working directory
    if "process_isolation" in backend.capabilities:  # else /proc/1/cmdline is world-readable
        assert host_init not in output
    await assert_still_works(run, workspace)


@pytest.fixture
def host_sleeper() -> Iterator[tuple[int, str]]:
    """A host process (pid, marker in its command line), killed with its group afterwards."""
    marker = f"cairn-host-{uuid.uuid4().hex}"
    host = subprocess.Popen(["sh", "-c", f"sleep 600; : {marker}"], start_new_session=True)
    yield host.pid, marker
    os.killpg(host.pid, signal.SIGKILL)  # the sleep too, not only its shell
    host.wait()


async def test_host_processes_are_unsignallable(
    run: Run, new_workspace, host_sleeper: tuple[int, str]
) -> None:
    pid, marker = host_sleeper
    workspace = await new_workspace()
    _, output = await run(f"kill -9 {pid}; kill -9 -- -{pid}; kill -9 -1; echo done", workspace)
    assert "done" in output
    assert host_processes_with(marker) == [pid]
    await assert_still_works(run, workspace)


async def test_host_processes_are_invisible(
    backend: SandboxBackend, run: Run, new_workspace, host_sleeper: tuple[int, str]
) -> None:
    requires_capability(backend, "process_isolation", "without a pid namespace /proc lists them")
    _, marker = host_sleeper
    workspace = await new_workspace()
    command = f"grep -l {marker} /proc/*/cmdline; ls /proc | grep -c '^[0-9]'"
    _, output = await run(command, workspace)
    lines = output.splitlines()
    assert marker not in output
    # /proc lists only the sandbox's own few processes.
    assert int(next(line for line in lines if line.isdigit())) < 10


async def test_no_network_to_host_loopback(run: Run, new_workspace) -> None:
    workspace = await new_workspace()
    with LoopbackListeners() as listeners:
        probe = listeners.probe_script(("127.0.0.1", "10.0.2.2", "192.0.2.2"))
        (workspace / "probe.py").write_text(probe)
        _, output = await run("python3 probe.py", workspace)
        assert "TCP-OK" not in output
        assert not listeners.received_anything()
    await assert_still_works(run, workspace)


async def test_enabled_network_still_does_not_reach_the_host(
    backend: SandboxBackend, run: Run, new_workspace
) -> None:
    """Network on means the egress proxy, which never connects to the host, and a probe that
    ignores the proxy gets nowhere; a backend that has no proxy refuses the command."""
    requires_capability(backend, "isolation", "an unconfined command uses the host's network")
    workspace = await new_workspace()
    with LoopbackListeners() as listeners:
        (workspace / "probe.py").write_text(listeners.probe_script(("127.0.0.1", "10.0.2.2", "192.0.2.2")))
        if "egress" not in backend.capabilities:
            with pytest.raises(SandboxError, match="egress proxy"):
                await run("python3 probe.py", workspace, network=True)
        else:
            _, output = await run("python3 probe.py", workspace, network=True)
            assert "TCP-OK" not in output
        assert not listeners.received_anything()


async def test_fork_bomb_is_bounded(run: Run, new_workspace) -> None:
    marker = f"cairn-bomb-{uuid.uuid4().hex}"
    workspace = await new_workspace()
    bomb = f"bomb() {{ bomb | bomb & }}; bomb; : {marker}"
    (workspace / "bomb.sh").write_text(bomb)
    limits = ResourceLimits(max_processes=64)
    result, _ = await run("sh bomb.sh; sleep 2", workspace, limits=limits, timeout_s=10)
    assert result.duration_s < 15  # ended on its own or by the timeout, never hung
    assert host_processes_with(marker) == []
    await assert_still_works(run, workspace)


async def test_process_count_limit_holds(run: Run, new_workspace) -> None:
    workspace = await new_workspace()
    (workspace / "spawn.py").write_text(
        "import subprocess\n"
        "children = []\n"
        "try:\n"
        "    for _ in range(100):\n"
        "        children.append(subprocess.Popen(['sleep', '30']))\n"
        "except OSError as error:\n"
        "    print('REFUSED', type(error).__name__)\n"
        "print('SPAWNED', len(children))\n"
    )
    _, output = await run("python3 spawn.py", workspace, limits=ResourceLimits(max_processes=32))
    assert "REFUSED" in output
    assert int(output.split()[-1]) < 32
    await assert_still_works(run, workspace)


async def test_memory_beyond_the_limit_is_contained(run: Run, new_workspace) -> None:
    workspace = await new_workspace()
    limits = ResourceLimits(memory_bytes=128 * MIB)
    command = "python3 -c \"b = b'x' * (1024 * 1024 * 1024); print('ALLOCATED', len(b))\""
    result, output = await run(command, workspace, limits=limits)
    assert result.exit_code not in (0, None)
    assert "ALLOCATED" not in output
    await assert_still_works(run, workspace)


async def test_disk_fill_stops_at_the_file_size_limit(run: Run, new_workspace) -> None:
    workspace = await new_workspace()
    limits = ResourceLimits(file_size_bytes=4 * MIB)
    command = "dd if=/dev/zero of=big bs=1M count=64; dd if=/dev/zero of=/tmp/big bs=1M count=64"
    result, _ = await run(command, workspace, limits=limits)
    assert result.exit_code != 0
    assert (workspace / "big").stat().st_size <= 4 * MIB
    await assert_still_works(run, workspace)


async def test_cpu_time_limit_kills_a_spinning_command(run: Run, new_workspace) -> None:
    workspace = await new_workspace()
    result, _ = await run(
        "while :; do :; done", workspace, limits=ResourceLimits(cpu_time_s=1), timeout_s=30
    )
    assert not result.timed_out  # the limit ended it, not the wall clock
    # 137 from a supervisor (bwrap), or the signal itself when the shell was the main process.
    assert result.exit_code != 0
    await assert_still_works(run, workspace)


async def test_open_files_limit_holds(run: Run, new_workspace) -> None:
    workspace = await new_workspace()
    command = (
        "python3 -c \"import os\nfds = []\ntry:\n  [fds.append(os.open('/dev/null', 0)) "
        "for _ in range(200)]\nexcept OSError as e: print('LIMITED', len(fds))\""
    )
    _, output = await run(command, workspace, limits=ResourceLimits(open_files=64))
    assert "LIMITED" in output
    await assert_still_works(run, workspace)


async def test_sessions_cannot_see_each_other(run: Run, new_workspace) -> None:
    marker = f"cairn-session-{uuid.uuid4().hex}"
    first, second = await new_workspace(), await new_workspace()
    (first / f"{marker}.txt").write_text("first session's file")
    ready = first / "ready"

    async def hold_first() -> None:
        await run(f"touch ready; {lingering(marker)}", first, timeout_s=30)

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold_first)
        await until(ready.exists, "the first session's command to start", timeout_s=20)
        # The bracket keeps the literal marker out of this command's own text and errors.
        pattern = f"cairn-sessio[n]-{marker.rsplit('-', 1)[1]}"
        command = (
            f"ls -a /workspace/.. /workspace; grep -l '{pattern}' /proc/*/cmdline; "
            f"find / -name '{pattern}*' 2>/dev/null; cat ../*/{pattern}.txt"
        )
        _, output = await run(command, second)
        tg.cancel_scope.cancel()
    assert marker not in output
    assert first.name not in output
    assert "first session's file" not in output
    assert host_processes_with(marker) == []
