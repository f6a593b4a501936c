"""The first fallback: namespaces + pivot_root + an unprivileged uid, without user namespaces.

For a root server on a host where bwrap cannot work (user namespaces disabled, or bwrap not
installed): root may create every other namespace itself. Cairn's launcher
(`_launcher/`) unshares mount, pid, ipc, uts, cgroup and (without network) net namespaces,
builds the same filesystem bwrap gives (`_rootfs.py`: read-only system dirs, generated
/etc, private /proc, /dev, /tmp, the workspace at /workspace, a read-only root), pivots into
it, then becomes the sandbox account for good: empty bounding set, no capabilities,
no_new_privs, and a seccomp filter that refuses new (user) namespaces, mounts and ptrace
(research/sandbox.md §2, done with syscalls instead of a 150 ms mount(8) script). The
command is pid 1 of its pid namespace, so every process of it dies when it ends, and the
launcher's waiter outside keeps it on a PDEATHSIG leash.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cairn.errors import SandboxError
from cairn.sandbox._account import SandboxAccount, resolve_sandbox_account
from cairn.sandbox._cgroups import discover_cgroups
from cairn.sandbox._containment import Containment
from cairn.sandbox._env import ENV_ISOLATION, command_env
from cairn.sandbox._launch import LaunchedBackend
from cairn.sandbox._launcher.spec import WORKSPACE
from cairn.sandbox._private_dir import private_dir
from cairn.sandbox._rootfs import (
    DEVICES,
    ETC_READ_ONLY,
    HOSTNAME,
    ROOTFS_ISOLATION,
    SANDBOX_HOME,
    SANDBOX_USER,
    generated_etc,
    system_layout,
)
from cairn.sandbox.base import ExecRequest

if TYPE_CHECKING:
    from cairn.sandbox._launcher.spec import Landlock, Rootfs

__all__ = ["NamespacesBackend"]


class NamespacesBackend(LaunchedBackend):
    """Runs each command in fresh namespaces built by Cairn's launcher; see module docstring."""

    name = "namespaces"
    capabilities = frozenset({"isolation", "workspace_mount", "process_isolation"})

    def __init__(self, *, account: SandboxAccount, containment: Containment) -> None:
        super().__init__(account=account, containment=containment)
        self._sandbox_account = account
        # An empty host directory each command's root tmpfs is mounted on (privately).
        root_dir = private_dir("sandbox-root", self)
        layout = system_layout()
        self._rootfs: Rootfs = {
            "root_dir": str(root_dir),
            "hostname": HOSTNAME,
            "read_only": [
                *layout.read_only,
                *(f"/etc/{name}" for name in ETC_READ_ONLY if os.path.exists(f"/etc/{name}")),
            ],
            "symlinks": list(layout.symlinks),
            "etc_files": generated_etc(account.uid, account.gid),
            "devices": [device for device in DEVICES if os.path.exists(device)],
        }

    @classmethod
    def detect(cls) -> NamespacesBackend:
        """Build the backend and prove it works here by running `true` in it (blocking)."""
        account = resolve_sandbox_account()
        if account is None:
            raise SandboxError(
                "the namespaces backend needs a root server: it creates namespaces and "
                "mounts as root, then drops to an unprivileged uid"
            )
        backend = cls(
            account=account,
            containment=Containment(
                cgroups=discover_cgroups(),
                nproc_counts=True,
                pid_namespace=True,
            ),
        )
        with tempfile.TemporaryDirectory(prefix="cairn-namespaces-probe-") as probe:
            backend._probe(Path(probe), None)
        return backend

    @property
    def isolation(self) -> Mapping[str, str]:
        return {
            "backend": "namespaces (Cairn's launcher: unshare + pivot_root + setresuid)",
            **ROOTFS_ISOLATION,
            "privileges": (
                "the host account below, no capabilities (empty bounding set), no_new_privs; "
                "seccomp refuses new namespaces, mounts, ptrace, bpf and keyrings"
            ),
            "host_user": self._sandbox_account.describe(),
            "environment": ENV_ISOLATION,
        }

    def _confinement(
        self, request: ExecRequest, scratch: Path | None
    ) -> tuple[Rootfs | None, Landlock | None]:
        return self._rootfs, None

    def _command(
        self, request: ExecRequest, scratch: Path | None
    ) -> tuple[list[str], dict[str, str], str]:
        env = command_env(home=SANDBOX_HOME, user=SANDBOX_USER, session_env=request.env)
        return ["/bin/sh", "-c", request.command], env, WORKSPACE
