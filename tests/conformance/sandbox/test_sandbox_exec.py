"""What every sandbox backend does for any command: output, exit status, timeout, cleanup."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import anyio
import pytest
from conftest import Recorder, Run, requires_capability

from cairn.errors import InvalidRequestError, WorkspaceError
from cairn.sandbox import WORKSPACE_MOUNT, ExecRequest, SandboxBackend
from cairn.sandbox.testing import host_processes_with
from tests.waits import until

pytestmark = pytest.mark.anyio


def lingering(marker: str) -> str:
    """A shell command that sleeps for a long time with `marker` in its command line."""
    return f"sh -c 'sleep 600; : {marker}'"


async def test_output_and_exit_code(run: Run, new_workspace) -> None:
    workspace = await new_workspace()
    result, output = await run("echo out; echo err >&2; exit 3", workspace)
    assert result.exit_code == 3
    assert not result.timed_out and result.signal is None
    assert "out\n" in output and "err\n" in output


async def test_output_streams_while_the_command_runs(
    backend: SandboxBackend, new_workspace
) -> None:
    """The command waits for a file the test creates only after seeing the first output."""
    workspace = await new_workspace()
    release = workspace / "release"
    seen = Recorder()

    async def on_output(chunk: bytes) -> None:
        await seen(chunk)
        if b"waiting" in chunk:
            release.write_text("go")

    command = "echo waiting; while [ ! -e release ]; do sleep 0.01; done; echo released"
    request = ExecRequest(command=command, workspace=workspace, timeout_s=20)
    result = await backend.exec(request, on_output)
    assert result.exit_code == 0
    assert seen.text == "waiting\nreleased\n"


async def test_working_directory_is_the_workspace(
    backend: SandboxBackend, run: Run, new_workspace
) -> None:
    workspace = await new_workspace()
    (workspace / "seed.txt").write_text("seeded")
    result, output = await run("pwd; cat seed.txt; echo made > made.txt", workspace)
    expected = WORKSPACE_MOUNT if "workspace_mount" in backend.capabilities else str(workspace)
    assert output.splitlines() == [expected, "seeded"]
    made = workspace / "made.txt"
    assert made.read_text() == "made\n"
    owner = backend.file_owner or (os.geteuid(), os.getegid())
    assert (made.stat().st_uid, made.stat().st_gid) == owner


async def test_own_root_shows_current_etc_files_read_only(
    backend: SandboxBackend, run: Run, new_workspace
) -> None:
    """Allowlisted /etc files carry the host's content (copied or bound), the generated
    passwd names the sandbox user, and none of it is writable."""
    requires_capability(backend, "workspace_mount", "a backend without its own root shows the host's /etc")
    workspace = await new_workspace()
    result, output = await run(
        "cat /etc/os-release; grep -c '^sandbox:' /etc/passwd; "
        "echo pwned >> /etc/os-release && echo WROTE; ls /etc/shadow 2>&1 || true", workspace
    )
    assert result.exit_code == 0, output
    assert output.startswith(Path("/etc/os-release").read_text())
    assert "\n1\n" in output and "WROTE" not in output
    assert "No such file" in output  # nothing outside the allowlist


async def test_environment_is_the_allowlist_plus_session_env(
    run: Run, new_workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAIRN_TEST_HOST_SECRET", "host-secret-value")
    workspace = await new_workspace()
    result, output = await run("env", workspace, env={"SESSION_VAR": "session value"})
    variables = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    assert variables["SESSION_VAR"] == "session value"
    assert "host-secret-value" not in output
    assert set(variables) <= {
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM", "TMPDIR", "PWD", "SHLVL",
        "SESSION_VAR", "OLDPWD", "_",
    }


async def test_invalid_env_name_is_rejected(run: Run, new_workspace) -> None:
    workspace = await new_workspace()
    with pytest.raises(InvalidRequestError):
        await run("true", workspace, env={"BAD=NAME": "x"})


async def test_missing_workspace_is_a_workspace_error(run: Run, workspace_root: Path) -> None:
    with pytest.raises(WorkspaceError):
        await run("true", workspace_root / "does-not-exist")


async def test_timeout_kills_the_whole_tree(run: Run, new_workspace) -> None:
    marker = f"cairn-timeout-{uuid.uuid4().hex}"
    workspace = await new_workspace()
    result, _ = await run(f"{lingering(marker)} & {lingering(marker)}", workspace, timeout_s=0.5)
    assert result.timed_out
    assert result.exit_code is None
    assert result.duration_s < 10
    assert host_processes_with(marker) == []


async def test_background_processes_do_not_outlive_the_command(
    run: Run, new_workspace
) -> None:
    marker = f"cairn-background-{uuid.uuid4().hex}"
    workspace = await new_workspace()
    command = (
        f"{lingering(marker)} > /dev/null 2>&1 & "
        f"setsid {lingering(marker)} > /dev/null 2>&1 & "
        f"nohup {lingering(marker)} & echo started"
    )
    result, output = await run(command, workspace)
    assert result.exit_code == 0
    assert "started" in output
    assert host_processes_with(marker) == []
    follow_up, output = await run("echo next", workspace)
    assert follow_up.exit_code == 0 and output == "next\n"


async def test_cancellation_kills_the_whole_tree(run: Run, new_workspace) -> None:
    marker = f"cairn-cancel-{uuid.uuid4().hex}"
    workspace = await new_workspace()
    started = workspace / "started"
    command = f"{lingering(marker)} & touch started; {lingering(marker)}"
    async with anyio.create_task_group() as tg:
        tg.start_soon(run, command, workspace)
        await until(started.exists, "the command to start", timeout_s=20)
        tg.cancel_scope.cancel()
    assert host_processes_with(marker) == []


async def test_commands_run_concurrently(run: Run, new_workspace) -> None:
    """Both commands must be running at once before the test lets either finish."""
    first, second = await new_workspace(), await new_workspace()
    results: list[int | None] = []

    async def one(workspace: Path) -> None:
        command = "touch mark; while [ ! -e done ]; do sleep 0.01; done"
        result, _ = await run(command, workspace)
        results.append(result.exit_code)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, first)
        tg.start_soon(one, second)
        await until(lambda: (first / "mark").exists() and (second / "mark").exists(), "both commands to run", timeout_s=20)
        (first / "done").touch()
        (second / "done").touch()
    assert results == [0, 0]
