"""The sandbox's pure helpers: environment, rlimit plan, account checks."""

from __future__ import annotations

import gc
import os
import resource
import shutil
import tempfile
from pathlib import Path

import pytest

from cairn.errors import InvalidRequestError, WorkspaceError
from cairn.sandbox._account import SandboxAccount, resolve_sandbox_account
from cairn.sandbox._env import DEFAULT_PATH, command_env
from cairn.sandbox._private_dir import private_dir
from cairn.sandbox._rlimits import plan_rlimits
from cairn.sandbox.base import ResourceLimits

NOBODY = SandboxAccount(uid=65534, gid=65534, name="nobody", is_dedicated=False)


def test_env_is_allowlist_plus_session_env() -> None:
    env = command_env(home="/tmp", user="sandbox", session_env={"FOO": "bar", "HOME": "/w"})
    assert env["PATH"] == DEFAULT_PATH
    assert env["FOO"] == "bar"
    assert env["HOME"] == "/w"  # the session may override the defaults
    assert set(env) == {"PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM", "TMPDIR", "FOO"}


@pytest.mark.parametrize("name, value", [("A=B", "x"), ("1ABC", "x"), ("", "x"), ("OK", "a\0b")])
def test_env_rejects_bad_variables(name: str, value: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        command_env(home="/tmp", user="sandbox", session_env={name: value})
    assert caught.value.param == "env"


def test_rlimit_plan_leaves_cgroup_limits_to_cgroups() -> None:
    limits = ResourceLimits(memory_bytes=1 << 30, max_processes=64, cpu_time_s=5,
                            file_size_bytes=1 << 20, open_files=128)
    plan = plan_rlimits(limits, memory_by_cgroup=True, processes_by_cgroup=True, nproc_counts=True)
    assert set(plan.enforced) == {"cpu_time_s", "file_size_bytes", "open_files"}
    assert (resource.RLIMIT_CPU, 5) in plan.values
    assert (resource.RLIMIT_FSIZE, 1 << 20) in plan.values
    fallback = plan_rlimits(
        limits, memory_by_cgroup=False, processes_by_cgroup=False, nproc_counts=True
    )
    assert (resource.RLIMIT_AS, 1 << 30) in fallback.values
    assert (resource.RLIMIT_NPROC, 64) in fallback.values
    uncounted = plan_rlimits(
        limits, memory_by_cgroup=False, processes_by_cgroup=False, nproc_counts=False
    )
    assert all(kind != resource.RLIMIT_NPROC for kind, _ in uncounted.values)


def test_rlimit_plan_clamps_to_the_hard_limit_and_skips_unset_fields() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limits = ResourceLimits(memory_bytes=None, max_processes=None, cpu_time_s=None,
                            file_size_bytes=None, open_files=hard + 1000)
    plan = plan_rlimits(limits, memory_by_cgroup=False, processes_by_cgroup=False, nproc_counts=True)
    assert plan.values == [(resource.RLIMIT_NOFILE, hard)]
    assert "clamped" in plan.enforced["open_files"]


def test_account_refuses_a_workspace_behind_a_private_directory(tmp_path: Path) -> None:
    private = tmp_path / "private"
    (private / "workspace").mkdir(parents=True)
    private.chmod(0o700)
    with pytest.raises(WorkspaceError) as caught:
        NOBODY.check_reachable(private / "workspace")
    assert caught.value.context["blocked_at"] in {str(private), *map(str, private.parents)}


def test_account_accepts_a_traversable_path() -> None:
    root = Path(tempfile.mkdtemp(prefix="cairn-reachable-"))  # in /tmp, which is 1777
    try:
        root.chmod(0o711)
        (root / "ws").mkdir()
        NOBODY.check_reachable(root / "ws")
    finally:
        shutil.rmtree(root)


def test_server_root_runs_commands_as_an_unprivileged_account() -> None:
    account = resolve_sandbox_account()
    if account is None:
        pytest.skip("the test runs unprivileged: commands run as the server's own user")
    assert account.uid != 0 and account.gid != 0
    assert account.is_dedicated or account.name == "nobody"


def test_private_dirs_are_fresh_and_those_of_dead_servers_are_removed() -> None:
    root = Path(tempfile.gettempdir())
    stale = root / f"cairn-unittest-{2**22 + 1}-abc"  # above pid_max's default: never alive
    (stale / "inner").mkdir(parents=True)

    class Owner:
        pass

    owner = Owner()
    path = private_dir("unittest", owner)
    assert not stale.exists()
    assert path.name.startswith(f"cairn-unittest-{os.getpid()}-")
    assert path.stat().st_mode & 0o777 == 0o700
    del owner
    gc.collect()
    assert not path.exists()
