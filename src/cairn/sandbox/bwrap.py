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
means no process of a command survives it, nor a crash of the server. The launcher
(`_launch.py`, the fork server's child) joins the command's cgroups, sets its rlimits and
drops to that account, then execs bwrap; the generated /etc files are written once per
backend into a private directory and bound read-only.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from cairn.errors import SandboxError
from cairn.sandbox._account import SandboxAccount, resolve_sandbox_account
from cairn.sandbox._cgroups import discover_cgroups
from cairn.sandbox._containment import Containment
from cairn.sandbox._env import DEFAULT_PATH, ENV_ISOLATION, command_env
from cairn.sandbox._launch import LaunchedBackend
from cairn.sandbox._private_dir import private_dir
from cairn.sandbox._rootfs import (
    ROOTFS_ISOLATION,
    ETC_READ_ONLY,
    HOSTNAME,
    SANDBOX_HOME,
    SANDBOX_USER,
    generated_etc,
    system_layout,
)
from cairn.sandbox.base import WORKSPACE_MOUNT, ExecRequest

__all__ = ["BwrapBackend"]

logger = logging.getLogger(__name__)

# The command's uid/gid inside bwrap's user namespace (mapped onto the host account).
SANDBOX_UID = 1000


class BwrapBackend(LaunchedBackend):
    """Runs each command in its own bubblewrap container; see the module docstring."""

    name = "bwrap"
    capabilities = frozenset({"isolation", "workspace_mount", "process_isolation"})
    seccomp = False  # bwrap confines the command itself (and --disable-userns)

    def __init__(
        self, *, bwrap: str, account: SandboxAccount | None, containment: Containment
    ) -> None:
        super().__init__(account=account, containment=containment)
        self._bwrap = bwrap
        # bwrap, running as the sandbox account, opens these files.
        etc_dir = private_dir("bwrap-etc", self, mode=0o755)
        for name, content in generated_etc(SANDBOX_UID, SANDBOX_UID).items():
            (etc_dir / name).write_text(content)
            (etc_dir / name).chmod(0o644)
        self._fixed_argv = _fixed_argv(bwrap, etc_dir)

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
        argv = [*self._fixed_argv]
        if request.network:
            argv.append("--share-net")
        argv += ["--bind", str(request.workspace), WORKSPACE_MOUNT,
                 # Last mount op: all but /workspace, /tmp and /dev/shm becomes read-only.
                 "--remount-ro", "/", "--chdir", WORKSPACE_MOUNT]
        for name, value in env.items():
            argv += ["--setenv", name, value]
        argv += ["--", "/bin/sh", "-c", request.command]
        # bwrap's pid 1 inside keeps this environment (readable in /proc/1/environ there),
        # so it is minimal, and it starts in `/`, not in the server's working directory.
        return argv, {"PATH": DEFAULT_PATH}, "/"


def _fixed_argv(bwrap: str, etc_dir: Path) -> list[str]:
    """The part of the bwrap command line that is the same for every command."""
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
    for name in ETC_READ_ONLY:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for generated in sorted(etc_dir.iterdir()):
        argv += ["--ro-bind", str(generated), f"/etc/{generated.name}"]
    return argv + ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
