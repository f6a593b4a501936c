"""Resource limits and process-tree cleanup for one command, shared by every backend.

Each command gets fresh cgroup leaves (`_cgroups.py`) and an rlimit plan (`_rlimits.py`).
Its launcher joins the leaves and applies the rlimits before the sandbox exists, so no
process of the command is ever outside them; a launcher that is a chain of execs (bwrap,
unconfined) does this with `exec_prefix`: `/bin/sh` writes its pid into the leaves, execs
`prlimit`, which execs `setpriv` to become the sandbox account (joining happens as the
server's user: cgroup v2 lets only a writer of the common ancestor move a process), which
execs the backend's argv. After the command, every member still alive is killed and the
leaves removed, shielded from cancellation (base.py invariants).
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from cairn._concurrency import run_sync
from cairn.errors import SandboxError
from cairn.sandbox._account import SandboxAccount
from cairn.sandbox._cgroups import CgroupHost, CommandCgroup
from cairn.sandbox._rlimits import RlimitPlan, plan_rlimits
from cairn.sandbox.base import ResourceLimits

__all__ = ["CommandContainment", "Containment"]

# Writes $$ into each cgroup.procs given before `--`, then execs the rest.
_JOIN_SCRIPT = 'while [ "$1" != -- ]; do echo $$ >"$1" || exit 125; shift; done; shift; exec "$@"'
_WALL_CLOCK = "wall-clock timeout; the whole process tree is killed"
_FIELDS = ("memory_bytes", "max_processes", "cpu_time_s", "file_size_bytes", "open_files")


@dataclass(frozen=True, slots=True)
class CommandContainment:
    """What one command is started under: its cgroup leaves, rlimits and leftover-killer."""

    cgroup: CommandCgroup | None
    rlimits: RlimitPlan
    prlimit: str | None
    setpriv: str | None

    @property
    def cgroup_procs(self) -> list[str]:
        return [str(path) for path in self.cgroup.procs_files] if self.cgroup is not None else []

    def exec_prefix(self, account: SandboxAccount | None) -> tuple[str, ...]:
        """argv to put in front of a backend's own argv; see the module docstring."""
        prefix: list[str] = []
        if self.cgroup is not None:
            prefix += ["/bin/sh", "-c", _JOIN_SCRIPT, "cairn-join", *self.cgroup_procs, "--"]
        if self.prlimit is not None and self.rlimits.limits:
            prefix += [self.prlimit, *self.rlimits.options, "--"]
        if account is not None:
            if self.setpriv is None:
                raise SandboxError("util-linux setpriv is needed to run commands as "
                                   f"{account.describe()} and was not found")
            prefix += [self.setpriv, f"--reuid={account.uid}", f"--regid={account.gid}",
                       "--clear-groups", "--"]
        return tuple(prefix)

    async def reap_leftovers(self) -> None:
        """Kill every process still in the command's cgroups."""
        if self.cgroup is not None:
            await run_sync(self.cgroup.kill)


class Containment:
    """Limits this host can enforce; one instance per backend.

    `launcher_sets_rlimits`: the backend's own launcher calls setrlimit, so util-linux
    `prlimit` is not needed. `pid_namespace`: each command is its own pid namespace, which
    the kernel kills whole when the command ends, whether or not a cgroup tracks it.
    """

    def __init__(
        self,
        *,
        cgroups: CgroupHost,
        nproc_counts: bool,
        launcher_sets_rlimits: bool = False,
        pid_namespace: bool = False,
    ) -> None:
        self._cgroups = cgroups
        self._pid_namespace = pid_namespace
        self._nproc_counts = nproc_counts
        self._launcher_sets_rlimits = launcher_sets_rlimits
        self._prlimit = None if launcher_sets_rlimits else shutil.which("prlimit")
        self._setpriv = shutil.which("setpriv")

    def limits_in_force(self, limits: ResourceLimits | None = None) -> dict[str, str]:
        """Per `ResourceLimits` field (plus `timeout_s`), the mechanism enforcing it.

        A `cgroups` entry says where command cgroups live and why a controller is unused.
        """
        limits = limits or ResourceLimits()
        rlimits_work = self._launcher_sets_rlimits or self._prlimit is not None
        missing = "not enforced on this host" if rlimits_work else (
            "not enforced: util-linux prlimit not found"
        )
        report = {
            field: missing if getattr(limits, field) is not None else "no limit requested"
            for field in _FIELDS
        }
        if rlimits_work:
            report.update(self.rlimit_plan(limits).enforced)
        memory = self._cgroups.version_of("memory")
        if memory == 2:
            report["memory_bytes"] = "cgroup v2 memory.max (no swap); the command is OOM-killed"
        elif memory == 1:
            report["memory_bytes"] = "cgroup v1 memory (+swap); the command is OOM-killed"
        pids = self._cgroups.version_of("pids")
        if pids is not None:
            report["max_processes"] = f"cgroup v{pids} pids, counted per command"
        elif not self._nproc_counts:
            report["max_processes"] = (
                "not enforced: no pids cgroup, and RLIMIT_NPROC does not bound commands "
                "running as host root or as the server's own user"
            )
        report["timeout_s"] = _WALL_CLOCK
        report["background_processes"] = self._cleanup()
        report["cgroups"] = self._cgroups.describe()
        return report

    @asynccontextmanager
    async def command(self, limits: ResourceLimits) -> AsyncIterator[CommandContainment]:
        """Set up one command's limits; on exit kill its leftovers and remove its cgroups."""
        cgroup: CommandCgroup | None = None
        if self._cgroups.in_use:
            cgroup = await run_sync(CommandCgroup.create, self._cgroups, limits)
        try:
            yield CommandContainment(
                cgroup=cgroup,
                rlimits=self.rlimit_plan(limits),
                prlimit=self._prlimit,
                setpriv=self._setpriv,
            )
        finally:
            if cgroup is not None:
                with anyio.CancelScope(shield=True):
                    await run_sync(cgroup.dispose)

    def _cleanup(self) -> str:
        if self._pid_namespace:
            return "killed with the command's pid namespace when it ends"
        if self._cgroups.in_use:
            return "found through the command's cgroup and killed when it ends"
        return (
            "NOT all found: no writable cgroup and no pid namespace, so a process that "
            "leaves the command's process group (setsid) can outlive the command"
        )

    def rlimit_plan(self, limits: ResourceLimits) -> RlimitPlan:
        """The rlimits for `limits` on this host (fields a cgroup enforces are left out)."""
        return plan_rlimits(
            limits,
            memory_by_cgroup=self._cgroups.version_of("memory") is not None,
            processes_by_cgroup=self._cgroups.version_of("pids") is not None,
            nproc_counts=self._nproc_counts,
        )
