"""The last fallback: Landlock + seccomp + an unprivileged uid + rlimits, no namespaces.

For hosts where no namespace can be created (a default Docker container, user namespaces
off and no CAP_SYS_ADMIN; research/sandbox.md §4). Cairn's launcher (`_launcher/`) becomes
the sandbox account (when the server is root), sets no_new_privs, and restricts itself
with Landlock before exec: read-write only the workspace and a private per-command
scratch directory (HOME and TMPDIR), read-only /usr, selected /etc entries and /proc,
a few device nodes, nothing else; no TCP bind or connect (ABI >= 4); signals and abstract
unix sockets scoped to the command (ABI >= 6). A seccomp filter refuses non-unix sockets
(so UDP and raw sockets too, which Landlock does not cover), new namespaces, mounts and
ptrace. What it cannot do, and says in `isolation`: hide host processes (/proc lists
them; it cannot signal or trace them), give the workspace a fixed path (commands see its
host path), or give the command its own hostname and IPC.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from cairn._concurrency import run_sync
from cairn.errors import SandboxError
from cairn.sandbox._account import SandboxAccount, resolve_sandbox_account
from cairn.sandbox._cgroups import discover_cgroups
from cairn.sandbox._containment import Containment
from cairn.sandbox._env import ENV_ISOLATION, command_env
from cairn.sandbox._launch import LaunchedBackend
from cairn.sandbox._launcher.landlock import SCOPING_ABI, abi_version
from cairn.sandbox._private_dir import private_dir
from cairn.sandbox._rootfs import DEVICES, ETC_READ_ONLY, SANDBOX_USER, system_layout
from cairn.sandbox.base import ExecRequest

if TYPE_CHECKING:
    from cairn.sandbox._launcher.spec import Landlock, Rootfs

__all__ = ["MIN_LANDLOCK_ABI", "LandlockBackend"]

MIN_LANDLOCK_ABI = 4  # the first ABI that confines TCP
# Host files a shell session expects to read; the host's own, not generated copies.
_ETC_HOST = ("passwd", "group", "hosts")


class LandlockBackend(LaunchedBackend):
    """Confines each command with Landlock and seccomp on the host; see module docstring."""

    name = "landlock"
    capabilities = frozenset({"isolation"})

    def __init__(
        self,
        *,
        abi: int,
        account: SandboxAccount | None,
        containment: Containment,
    ) -> None:
        super().__init__(account=account, containment=containment)
        self._abi = abi
        # Traversable, so the sandbox account reaches its own scratch directory in it.
        self._scratch_root = private_dir("landlock", self, mode=0o711)
        layout = system_layout()
        self._read_only = [
            *layout.read_only,
            *(f"/etc/{name}" for name in (*ETC_READ_ONLY, *_ETC_HOST)),
            "/proc",
        ]

    @classmethod
    def detect(cls, *, abi: int | None = None) -> LandlockBackend:
        """Build the backend and prove it works here by running `true` in it (blocking).

        `abi` overrides the kernel's Landlock ABI version (tests of the refusal path).
        """
        abi = abi_version() if abi is None else abi
        if abi < MIN_LANDLOCK_ABI:
            raise SandboxError(
                f"Landlock ABI {abi} is too old or Landlock is disabled (need >= "
                f"{MIN_LANDLOCK_ABI} to confine TCP; kernel >= 6.7 with lsm=...,landlock)"
            )
        account = resolve_sandbox_account()
        backend = cls(
            abi=abi,
            account=account,
            containment=Containment(
                cgroups=discover_cgroups(),
                nproc_counts=account is not None,
            ),
        )
        with tempfile.TemporaryDirectory(prefix="cairn-landlock-probe-") as probe:
            scratch = backend._new_scratch()
            try:
                backend._probe(Path(probe), scratch)
            finally:
                shutil.rmtree(scratch)
        return backend

    @property
    def isolation(self) -> Mapping[str, str]:
        scoping = (
            "signals and abstract unix sockets are scoped to the command"
            if self._abi >= SCOPING_ABI
            else f"signals are NOT scoped (Landlock ABI {self._abi} < {SCOPING_ABI})"
        )
        host_user = (
            self._account.describe()
            if self._account is not None
            else f"the server's own user (uid {os.geteuid()})"
        )
        return {
            "backend": f"landlock (Landlock ABI {self._abi} + seccomp, no namespaces)",
            "filesystem": (
                "only the workspace (at its host path, not /workspace) and a private scratch "
                "directory (HOME, TMPDIR) are writable; /usr, selected /etc files and /proc "
                "are readable; everything else is denied"
            ),
            "network": (
                "none by default: TCP bind/connect denied by Landlock, every non-unix socket "
                "(UDP, raw) refused by seccomp; commands of sessions that enable network are "
                "refused (network goes through Cairn's egress proxy, which needs bwrap)"
            ),
            "processes": (
                "NOT hidden: host processes are listed in /proc (no pid namespace); ptrace "
                f"and /proc/<pid>/environ of processes outside the command are denied; {scoping}"
            ),
            "privileges": (
                "no_new_privs; seccomp refuses new namespaces, mounts, ptrace, bpf and keyrings"
            ),
            "host_user": host_user,
            "environment": ENV_ISOLATION,
        }

    @asynccontextmanager
    async def _scratch(self) -> AsyncIterator[Path | None]:
        scratch = await run_sync(self._new_scratch)
        try:
            yield scratch
        finally:
            with anyio.CancelScope(shield=True):
                # rmtree does not follow symlinks a command planted in its scratch directory.
                await run_sync(shutil.rmtree, scratch)

    def _new_scratch(self) -> Path:
        scratch = Path(tempfile.mkdtemp(prefix="cmd-", dir=self._scratch_root))
        if self._account is not None:
            os.chown(scratch, self._account.uid, self._account.gid)
        return scratch

    def _confinement(
        self, request: ExecRequest, scratch: Path | None
    ) -> tuple[Rootfs | None, Landlock | None]:
        if scratch is None:
            raise SandboxError("the landlock backend runs every command with a scratch directory")
        return None, {
            "abi": self._abi,
            "read_write": [str(request.workspace), str(scratch)],
            "read_only": self._read_only,
            "devices": list(DEVICES),
        }

    def _command(
        self, request: ExecRequest, scratch: Path | None
    ) -> tuple[list[str], dict[str, str], str]:
        home = str(scratch)
        env = command_env(
            home=home, user=SANDBOX_USER, session_env=request.env, tmpdir=home
        )
        return ["/bin/sh", "-c", request.command], env, str(request.workspace)
