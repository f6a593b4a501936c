"""The default sandbox: each command in a fresh bubblewrap container (design invariant 8).

Profile (research/sandbox.md §1 and Recommendation): every namespace unshared, a user
namespace in which the command is uid/gid 1000 with no capabilities and no nested user
namespaces, a new session (no TIOCSTI into a terminal), an environment built from the
allowlist only. The filesystem is a read-only root with `/usr`, the `/bin`-style links and a
few `/etc` files read-only, a generated `/etc/passwd`, a private tmpfs `/tmp`, and the
workspace read-write at `/workspace`. Network is the container's own loopback only, unless
the request asks for network, which then shares the host's (including its loopback).

When the server is root, bwrap itself is launched as the dedicated unprivileged host
account (`_account.py`): run as root, bwrap keeps every capability inside and a read-only
bind can be remounted writable onto host files. The pid namespace plus `--die-with-parent`
means no process of a command survives it, nor a crash of the server.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from cairn._concurrency import run_sync
from cairn.errors import SandboxError, WorkspaceError
from cairn.sandbox._account import SandboxAccount, resolve_sandbox_account
from cairn.sandbox._cgroups import discover_cgroups
from cairn.sandbox._containment import Containment
from cairn.sandbox._env import DEFAULT_PATH, command_env
from cairn.sandbox._process import Launch, run_supervised
from cairn.sandbox._rootfs import (
    ETC_READ_ONLY,
    HOSTNAME,
    SANDBOX_HOME,
    SANDBOX_USER,
    generated_etc,
    system_layout,
)
from cairn.sandbox._workspace import hand_over_workspace
from cairn.sandbox.base import (
    WORKSPACE_MOUNT,
    ExecRequest,
    ExecResult,
    OutputSink,
    SandboxBackend,
)

__all__ = ["BwrapBackend"]

logger = logging.getLogger(__name__)

# The command's uid/gid inside bwrap's user namespace (mapped onto the host account).
SANDBOX_UID = 1000
_PROBE_TIMEOUT_S = 30.0


class BwrapBackend(SandboxBackend):
    """Runs each command in its own bubblewrap container; see the module docstring."""

    name = "bwrap"
    capabilities = frozenset({"isolation", "workspace_mount", "process_isolation"})

    def __init__(
        self, *, bwrap: str, account: SandboxAccount | None, containment: Containment
    ) -> None:
        self._bwrap = bwrap
        self._account = account
        self._containment = containment
        self._system_binds = _system_binds()

    @classmethod
    def detect(cls) -> BwrapBackend:
        """Build the backend for this host and prove it works by running `true` in it.

        Raises `SandboxError` saying why bwrap cannot isolate here (not installed, user
        namespaces disabled, ...). Blocking: call at startup or through `run_sync`.
        """
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxError("bubblewrap is not installed (apt-get install bubblewrap)")
        account = resolve_sandbox_account()
        backend = cls(
            bwrap=bwrap,
            account=account,
            containment=Containment(
                cgroups=discover_cgroups(), nproc_counts=account is not None, pid_namespace=True
            ),
        )
        backend._probe()
        return backend

    @property
    def isolation(self) -> Mapping[str, str]:
        owner = (
            self._account.describe()
            if self._account is not None
            else f"the server's own user (uid {os.geteuid()})"
        )
        return {
            "backend": f"bwrap ({self._bwrap})",
            "filesystem": (
                "only the workspace (read-write at /workspace) and a private /tmp are "
                "writable; /usr and selected /etc files are read-only; the rest of the host "
                "filesystem is absent"
            ),
            "network": (
                "none by default (own network namespace, loopback only); a session that "
                "enables network shares the host's network, including its loopback"
            ),
            "processes": "own pid, ipc, uts and cgroup namespaces; host processes are invisible",
            "privileges": (
                f"uid/gid {SANDBOX_UID} inside, no capabilities, no nested user namespaces, "
                "new session"
            ),
            "host_user": owner,
            "environment": "fixed allowlist plus the session's env; nothing from the server",
        }

    @property
    def limits_in_force(self) -> Mapping[str, str]:
        return self._containment.limits_in_force()

    @property
    def file_owner(self) -> tuple[int, int] | None:
        if self._account is None:
            return None
        return (self._account.uid, self._account.gid)

    async def prepare_workspace(self, workspace: Path) -> None:
        """Check the sandbox account can reach `workspace`, then give it the workspace's files."""
        await run_sync(hand_over_workspace, workspace, self._account)

    async def exec(self, request: ExecRequest, on_output: OutputSink) -> ExecResult:
        if not await run_sync(request.workspace.is_dir):
            raise WorkspaceError(f"workspace {request.workspace} is not a directory")
        env = command_env(home=SANDBOX_HOME, user=SANDBOX_USER, session_env=request.env)
        async with self._containment.command(request.limits) as contained:
            with _generated_etc() as etc_fds:
                argv = self._argv(request.workspace, request.network, etc_fds, env)
                launch = Launch(
                    argv=[*contained.exec_prefix(self._account), *argv,
                          "/bin/sh", "-c", request.command],
                    # The sandbox's pid 1 is a bwrap process that keeps this environment
                    # (readable in /proc/1/environ inside), so it is minimal and the cwd is
                    # `/`, not the server's (the launcher shell exports PWD).
                    env={"PATH": DEFAULT_PATH},
                    cwd=Path("/"),
                    pass_fds=tuple(etc_fds.values()),
                )
                return await run_supervised(
                    launch,
                    timeout_s=request.timeout_s,
                    on_output=on_output,
                    reap_leftovers=contained.reap_leftovers,
                )

    def _argv(
        self,
        workspace: Path,
        network: bool,
        etc_fds: Mapping[str, int],
        env: Mapping[str, str],
    ) -> list[str]:
        argv = [self._bwrap, "--unshare-all"]
        if network:
            argv.append("--share-net")
        argv += [
            "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--cap-drop", "ALL", "--disable-userns", "--die-with-parent", "--new-session",
            "--clearenv", "--hostname", HOSTNAME,
            *self._system_binds,
        ]
        for name, fd in etc_fds.items():
            argv += ["--ro-bind-data", str(fd), f"/etc/{name}"]
        argv += [
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--bind", str(workspace), WORKSPACE_MOUNT,
            # Last mount op: everything but /workspace, /tmp and /dev/shm becomes read-only.
            "--remount-ro", "/",
            "--chdir", WORKSPACE_MOUNT,
        ]
        for name, value in env.items():
            argv += ["--setenv", name, value]
        argv.append("--")
        return argv

    def _probe(self) -> None:
        with tempfile.TemporaryDirectory(prefix="cairn-bwrap-probe-") as probe_dir:
            workspace = Path(probe_dir)
            hand_over_workspace(workspace, self._account)
            with _generated_etc() as etc_fds:
                argv = self._argv(workspace, False, etc_fds, {"PATH": DEFAULT_PATH})
                try:
                    done = subprocess.run(
                        [*argv, "/bin/true"],
                        capture_output=True,
                        env={"PATH": DEFAULT_PATH},
                        pass_fds=tuple(etc_fds.values()),
                        user=self._account.uid if self._account is not None else None,
                        group=self._account.gid if self._account is not None else None,
                        extra_groups=() if self._account is not None else None,
                        timeout=_PROBE_TIMEOUT_S,
                        check=False,
                    )
                except (OSError, subprocess.TimeoutExpired) as exc:
                    raise SandboxError(f"bubblewrap probe could not run: {exc}") from exc
        if done.returncode != 0:
            reason = done.stderr.decode(errors="replace").strip()
            raise SandboxError(
                f"bubblewrap cannot create a sandbox on this host: {reason}",
                context={"returncode": done.returncode},
            )


def _system_binds() -> list[str]:
    """Read-only /usr, the merged-/usr links (or binds) and the /etc allowlist."""
    layout = system_layout()
    argv: list[str] = []
    for path in layout.read_only:
        argv += ["--ro-bind", path, path]
    for target, path in layout.symlinks:
        argv += ["--symlink", target, path]
    for name in ETC_READ_ONLY:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return argv


@contextmanager
def _generated_etc() -> Iterator[dict[str, int]]:
    """Pipes carrying the generated /etc files to bwrap; the read ends are closed on exit.

    Each file is far below a pipe's buffer, so writing it all before bwrap starts cannot block.
    """
    fds: dict[str, int] = {}
    try:
        for name, content in generated_etc(SANDBOX_UID, SANDBOX_UID).items():
            read_end, write_end = os.pipe()
            fds[name] = read_end
            with os.fdopen(write_end, "wb") as writer:
                writer.write(content.encode())
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)
