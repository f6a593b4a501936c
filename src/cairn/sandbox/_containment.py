"""Resource limits and process-tree cleanup for one command, shared by every backend.

Each command gets fresh cgroup leaves (`_cgroups.py`) and an rlimit plan (`_rlimits.py`).
The launcher (`_launcher/main.py`) joins the leaves and sets the rlimits first thing, as
root and before the sandbox exists, so no process of the command is ever outside them
(joining as root also satisfies cgroup v2, which lets a process move only if the writer
may write the common ancestor's `cgroup.procs`). After the command, every member still
alive is killed and the leaves removed, shielded from cancellation (base.py invariants).
The leaves are made in the same worker-thread trip that checks the command's workspace.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio

from cairn._concurrency import run_sync
from cairn.sandbox._cgroups import CgroupHost, CommandCgroup
from cairn.sandbox._rlimits import RlimitPlan, plan_rlimits
from cairn.sandbox._workspace import WorkspaceIdentity, workspace_identity
from cairn.sandbox.base import ResourceLimits

__all__ = ["CommandContainment", "Containment"]

_WALL_CLOCK = "wall-clock timeout; the whole process tree is killed"
_FIELDS = ("memory_bytes", "max_processes", "cpu_time_s", "file_size_bytes", "open_files")


@dataclass(frozen=True, slots=True)
class CommandContainment:
    """What one command is started under: its cgroup leaves, rlimits and leftover-killer,
    and the identity of the workspace directory it was checked against."""

    cgroup: CommandCgroup | None
    rlimits: RlimitPlan
    workspace: WorkspaceIdentity

    @property
    def cgroup_join(self) -> list[str]:
        """The files the launcher writes "0" into to join the command's cgroups."""
        return [str(path) for path in self.cgroup.join_files] if self.cgroup is not None else []

    async def reap_leftovers(self) -> None:
        """Kill every process still in the command's cgroups, then remove them.

        Called once the command's main process has ended; one trip to a worker thread
        for both (each trip costs a wake-up, on the path from the command's exit to the
        result). The cleanup in `Containment.command` then has nothing left to do.
        """
        if self.cgroup is not None:
            await run_sync(self.cgroup.dispose)


class Containment:
    """Limits this host can enforce; one instance per backend.

    `pid_namespace`: each command is its own pid namespace, which
    the kernel kills whole when the command ends, whether or not a cgroup tracks it.
    """

    def __init__(
        self,
        *,
        cgroups: CgroupHost,
        nproc_counts: bool,
        pid_namespace: bool = False,
    ) -> None:
        self._cgroups = cgroups
        self._pid_namespace = pid_namespace
        self._nproc_counts = nproc_counts

    def limits_in_force(self, limits: ResourceLimits | None = None) -> dict[str, str]:
        """Per `ResourceLimits` field (plus `timeout_s`), the mechanism enforcing it.

        A `cgroups` entry says where command cgroups live and why a controller is unused.
        """
        limits = limits or ResourceLimits()
        report = {
            field: "not enforced on this host" if getattr(limits, field) is not None
            else "no limit requested"
            for field in _FIELDS
        }
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
    async def command(
        self, limits: ResourceLimits, workspace: Path
    ) -> AsyncIterator[CommandContainment]:
        """Check that `workspace` is a directory (`WorkspaceError`) and set up one command's
        limits; on exit kill its leftovers and remove its cgroups.

        Both in one trip to a worker thread: each trip costs a wake-up before the command
        can start.
        """
        identity, cgroup = await run_sync(self._prepare, limits, workspace)
        try:
            yield CommandContainment(
                cgroup=cgroup, rlimits=self.rlimit_plan(limits), workspace=identity
            )
        finally:
            if cgroup is not None and not cgroup.removed:  # e.g. the command never started
                with anyio.CancelScope(shield=True):
                    await run_sync(cgroup.dispose)

    def _prepare(
        self, limits: ResourceLimits, workspace: Path
    ) -> tuple[WorkspaceIdentity, CommandCgroup | None]:
        identity = workspace_identity(workspace)
        if not self._cgroups.in_use:
            return identity, None
        return identity, CommandCgroup.create(self._cgroups, limits)

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
