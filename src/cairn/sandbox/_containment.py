"""Resource limits and process-tree cleanup for one command, shared by every backend.

A command is started through a launcher prefix: `/bin/sh` writes its own pid into the
command's cgroups, then execs `prlimit` with the rlimits, which execs the backend's argv.
Joining before the sandbox exists means no process of the command is ever outside its
cgroups. After the command, every member still alive is killed and the cgroups removed,
shielded from cancellation (base.py invariants).
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from cairn._concurrency import run_sync
from cairn.sandbox._cgroups import CgroupHost, CommandCgroup
from cairn.sandbox._rlimits import RlimitPlan, plan_rlimits
from cairn.sandbox.base import ResourceLimits

__all__ = ["CommandContainment", "Containment"]

# Writes $$ into each cgroup.procs given before `--`, then execs the rest.
_JOIN_SCRIPT = 'while [ "$1" != -- ]; do echo $$ >"$1" || exit 125; shift; done; shift; exec "$@"'
_WALL_CLOCK = "wall-clock timeout; the whole process tree is killed"


@dataclass(frozen=True, slots=True)
class CommandContainment:
    """What one command is started under: an argv prefix and its leftover-killer."""

    prefix: tuple[str, ...]
    cgroup: CommandCgroup | None

    async def reap_leftovers(self) -> None:
        """Kill every process still in the command's cgroups."""
        if self.cgroup is not None:
            await run_sync(self.cgroup.kill)


class Containment:
    """Limits this host can enforce; one instance per backend."""

    def __init__(self, *, cgroups: CgroupHost, nproc_counts: bool) -> None:
        self._cgroups = cgroups
        self._nproc_counts = nproc_counts
        self._prlimit = shutil.which("prlimit")

    def limits_in_force(self, limits: ResourceLimits | None = None) -> dict[str, str]:
        """Per `ResourceLimits` field (plus `timeout_s`), the mechanism enforcing it.

        A `cgroups` entry says where command cgroups live and why a controller is unused.
        """
        limits = limits or ResourceLimits()
        missing = "not enforced: util-linux prlimit not found" if self._prlimit is None else (
            "not enforced on this host"
        )
        report = {
            field: missing if getattr(limits, field) is not None else "no limit requested"
            for field in _FIELDS
        }
        if self._prlimit is not None:
            report.update(self._rlimit_plan(limits).enforced)
        if self._cgroups.has_memory:
            report["memory_bytes"] = "cgroup v1 memory (+swap); the command is OOM-killed"
        if self._cgroups.has_pids:
            report["max_processes"] = "cgroup v1 pids, counted per command"
        elif not self._nproc_counts:
            report["max_processes"] = (
                "not enforced: no pids cgroup, and RLIMIT_NPROC does not bound commands "
                "running as host root or as the server's own user"
            )
        report["timeout_s"] = _WALL_CLOCK
        report["cgroups"] = self._cgroups.describe()
        return report

    @asynccontextmanager
    async def command(
        self, limits: ResourceLimits, *, joiner_uid: int | None
    ) -> AsyncIterator[CommandContainment]:
        """Set up one command's limits; on exit kill its leftovers and remove its cgroups."""
        cgroup: CommandCgroup | None = None
        if self._cgroups.parents:
            cgroup = await run_sync(
                CommandCgroup.create, self._cgroups, limits, joiner_uid=joiner_uid
            )
        prefix: list[str] = []
        if cgroup is not None:
            prefix += ["/bin/sh", "-c", _JOIN_SCRIPT, "cairn-join",
                       *map(str, cgroup.procs_files), "--"]
        if self._prlimit is not None:
            options = self._rlimit_plan(limits).options
            if options:
                prefix += [self._prlimit, *options, "--"]
        try:
            yield CommandContainment(prefix=tuple(prefix), cgroup=cgroup)
        finally:
            if cgroup is not None:
                with anyio.CancelScope(shield=True):
                    await run_sync(cgroup.dispose)

    def _rlimit_plan(self, limits: ResourceLimits) -> RlimitPlan:
        return plan_rlimits(
            limits,
            memory_by_cgroup=self._cgroups.has_memory,
            processes_by_cgroup=self._cgroups.has_pids,
            nproc_counts=self._nproc_counts,
        )


_FIELDS = ("memory_bytes", "max_processes", "cpu_time_s", "file_size_bytes", "open_files")
