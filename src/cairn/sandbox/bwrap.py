"""The default sandbox's per-command form: each command in a fresh bubblewrap container.

Design invariant 8. Where the host allows it, the default is its session form instead
(`bwrap_sessions.py`): the same container, started once per session workspace and
network setting, which every command joins. This module is the profile both share and
the fallback where that form does not work (no cgroups to find a command's processes,
Landlock too old to keep commands off the container's init).

Profile (research/sandbox.md §1 and Recommendation): every namespace unshared, a user
namespace in which the command is uid/gid 1000 with no capabilities and no nested user
namespaces, a new session (no TIOCSTI into a terminal), an environment built from the
allowlist only. The filesystem is a read-only root with `/usr`, the `/bin`-style links and a
few `/etc` files read-only, a generated `/etc/passwd`, a private tmpfs `/tmp`, and the
workspace read-write at `/workspace`. Network is the container's own namespace with
loopback only; a container never shares the host's. A command with network needs the session
form, whose containers reach the outside through Cairn's egress proxy (`egress/`); this
form refuses one (`LaunchedBackend.exec`).

When the server is root, bwrap itself is launched as the dedicated unprivileged host
account (`_account.py`): run as root, bwrap keeps every capability inside and a read-only
bind can be remounted writable onto host files. The pid namespace plus `--die-with-parent`
means no process of a command survives it, nor a crash of the server. The launcher
(`_launch.py`, the fork server's child) joins the command's cgroups, sets its rlimits and
drops to that account, then execs bwrap.

The /etc allowlist's directories are bound read-only; its files, and the generated passwd,
group and hosts, are handed to bwrap as descriptors (`--file`) that it copies into the
container's root before making it read-only. Each bind costs bwrap a mount, a remount and
a pass over /proc/self/mountinfo; the copies took 1.5-5 ms off every command's start on
the reference host (docs/sandbox.md). The launcher opens the host files afresh for each
command, as the sandbox account, so a command sees their current content, as with a bind.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from cairn.errors import SandboxError
from cairn.sandbox._account import SandboxAccount, resolve_sandbox_account
from cairn.sandbox._cgroups import discover_cgroups
from cairn.sandbox._containment import Containment
from cairn.sandbox._env import DEFAULT_PATH, ENV_ISOLATION, command_env
from cairn.sandbox._launch import LaunchedBackend
from cairn.sandbox._rootfs import (
    ETC_READ_ONLY,
    HOSTNAME,
    ROOTFS_ISOLATION,
    SANDBOX_HOME,
    SANDBOX_USER,
    generated_etc,
    system_layout,
)
from cairn.sandbox.base import WORKSPACE_MOUNT, ExecRequest

__all__ = ["PER_COMMAND", "BwrapBackend", "bwrap_usage", "locate_bwrap", "workspace_argv"]

logger = logging.getLogger(__name__)

# The command's uid/gid inside bwrap's user namespace (mapped onto the host account).
SANDBOX_UID = 1000
# The descriptor numbers of the files handed to bwrap start here (0-2 are the command's).
_FIRST_FILE_FD = 10
PER_COMMAND = "a fresh bwrap container for each command"


class BwrapBackend(LaunchedBackend):
    """Runs each command in its own bubblewrap container; see the module docstring."""

    name = "bwrap"
    capabilities = frozenset({"isolation", "workspace_mount", "process_isolation"})
    seccomp = False  # bwrap confines the command itself (and --disable-userns)

    def __init__(
        self,
        *,
        bwrap: str,
        account: SandboxAccount | None,
        containment: Containment,
        file_perms: bool = True,
    ) -> None:
        """`file_perms`: this bwrap knows `--perms` (0.5 and later), so copied files are 0444."""
        super().__init__(account=account, containment=containment)
        self._bwrap = bwrap
        self._fixed_argv, self._etc_files = _fixed_argv(bwrap, file_perms=file_perms)
        # How containers are used, for `isolation`; `detect_bwrap` adds why not per session.
        self.containers = PER_COMMAND

    @classmethod
    def detect(cls) -> BwrapBackend:
        """Build the per-command backend for this host and prove it works by running `true`.

        Raises `SandboxError` saying why bwrap cannot isolate here (not installed, user
        namespaces disabled, ...). Blocking: call at startup or through `run_sync`.
        """
        bwrap = locate_bwrap()
        account = resolve_sandbox_account()
        backend = cls(
            bwrap=bwrap,
            file_perms=b"--perms" in bwrap_usage(bwrap),
            account=account,
            containment=Containment(
                cgroups=discover_cgroups(), nproc_counts=account is not None, pid_namespace=True
            ),
        )
        with tempfile.TemporaryDirectory(prefix="cairn-bwrap-probe-") as probe:
            backend._probe(Path(probe), None)
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
            "containers": self.containers,
            **ROOTFS_ISOLATION,
            "privileges": (
                f"uid/gid {SANDBOX_UID} inside, no capabilities, no nested user namespaces, "
                "new session"
            ),
            "host_user": owner,
            "environment": ENV_ISOLATION,
        }

    def _command(
        self, request: ExecRequest, scratch: Path | None
    ) -> tuple[list[str], dict[str, str], str]:
        env = command_env(home=SANDBOX_HOME, user=SANDBOX_USER, session_env=request.env)
        argv = [*self._fixed_argv, "--tmpfs", "/tmp",
                *workspace_argv(request.workspace)]
        for name, value in env.items():
            argv += ["--setenv", name, value]
        argv += ["--", "/bin/sh", "-c", request.command]
        # bwrap's pid 1 inside keeps this environment (readable in /proc/1/environ there),
        # so it is minimal, and it starts in `/`, not in the server's working directory.
        return argv, {"PATH": DEFAULT_PATH}, "/"

    def _files(self) -> list[tuple[int, str | bytes]]:
        return self._etc_files


def locate_bwrap() -> str:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxError("bubblewrap is not installed (apt-get install bubblewrap)")
    return bwrap


def bwrap_usage(bwrap: str) -> bytes:
    """`bwrap --help`, to tell which options this version knows; empty if it cannot run
    (the probe that follows says what is wrong with it)."""
    try:
        return subprocess.run(
            [bwrap, "--help"], capture_output=True, check=False, timeout=10, env={}
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return b""


def workspace_argv(workspace: Path) -> list[str]:
    """The workspace at /workspace and the read-only root: the last part of a container's
    filesystem, after its tmpfs mounts and any files added to it."""
    return [
        "--bind", str(workspace), WORKSPACE_MOUNT,
        # Last mount op: all but /workspace and the tmpfs mounts becomes read-only.
        "--remount-ro", "/", "--chdir", WORKSPACE_MOUNT,
    ]


def _fixed_argv(
    bwrap: str, *, file_perms: bool
) -> tuple[list[str], list[tuple[int, str | bytes]]]:
    """The part of the bwrap command line that is the same for every container up to its
    tmpfs mounts, and the files it copies in (`--file <fd>`: descriptor number, host path
    or content). Without `--perms` a copy's mode follows the umask; the root is read-only
    either way."""
    perms = ["--perms", "0444"] if file_perms else []
    argv = [
        bwrap, "--unshare-all",
        "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
        "--cap-drop", "ALL", "--disable-userns", "--die-with-parent", "--new-session",
        "--clearenv", "--hostname", HOSTNAME,
    ]
    layout = system_layout()
    for path in layout.read_only:
        argv += ["--ro-bind", path, path]
    for target, path in layout.symlinks:
        argv += ["--symlink", target, path]
    files: list[tuple[int, str | bytes]] = []
    for name in ETC_READ_ONLY:
        path = f"/etc/{name}"
        if os.path.isdir(path):
            argv += ["--ro-bind-try", path, path]
        elif os.path.exists(path):  # a file, or a link to one (copied: a bind follows it too)
            files.append((_FIRST_FILE_FD + len(files), path))
            argv += [*perms, "--file", str(files[-1][0]), path]
    for name, content in generated_etc(SANDBOX_UID, SANDBOX_UID).items():
        files.append((_FIRST_FILE_FD + len(files), content.encode()))
        argv += [*perms, "--file", str(files[-1][0]), f"/etc/{name}"]
    return argv + ["--proc", "/proc", "--dev", "/dev"], files
