"""Per-command rlimits: the floor under every backend's resource limits.

RLIMIT_FSIZE, RLIMIT_CPU and RLIMIT_NOFILE always, and RLIMIT_AS / RLIMIT_NPROC only where
no cgroup enforces memory / process count (an address space limit breaks runtimes that
reserve large mappings, and NPROC counts every process of a host uid, not of one command).
The bwrap and unconfined backends apply them with util-linux `prlimit` in front of the
sandbox (forking the threaded server with Python code to run in the child is unsafe;
`prlimit` costs ~1 ms); the launcher-based backends call setrlimit in their launcher.
The server may lack CAP_SYS_RESOURCE (research/sandbox.md §6), so a limit is clamped to
the server's own hard limit, and the report says so.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from cairn.sandbox.base import ResourceLimits

__all__ = ["RlimitPlan", "plan_rlimits"]

_INFINITY = resource.RLIM_INFINITY


@dataclass(frozen=True, slots=True)
class RlimitPlan:
    """The rlimits for one command and, per limit field, how it is enforced."""

    # (prlimit option name, resource.RLIMIT_*, value used as both soft and hard limit)
    limits: tuple[tuple[str, int, int], ...]
    enforced: dict[str, str]

    @property
    def options(self) -> tuple[str, ...]:
        """The same limits as `prlimit` command-line options."""
        return tuple(f"--{flag}={value}:{value}" for flag, _, value in self.limits)

    @property
    def values(self) -> list[tuple[int, int]]:
        """The same limits as (resource.RLIMIT_*, value) pairs for setrlimit."""
        return [(kind, value) for _, kind, value in self.limits]


def plan_rlimits(
    limits: ResourceLimits, *, memory_by_cgroup: bool, processes_by_cgroup: bool, nproc_counts: bool
) -> RlimitPlan:
    """Choose rlimits for `limits`; fields already enforced by a cgroup are left to it.

    `nproc_counts` is False when RLIMIT_NPROC would not bound the command (host uid 0 is
    exempt) or would count unrelated processes of the server's own user.
    """
    chosen: list[tuple[str, int, int]] = []
    enforced: dict[str, str] = {}
    wanted: list[tuple[str, str, int, int | None, str]] = [
        ("cpu_time_s", "cpu", resource.RLIMIT_CPU, limits.cpu_time_s, "rlimit CPU, per process"),
        ("file_size_bytes", "fsize", resource.RLIMIT_FSIZE, limits.file_size_bytes, "rlimit FSIZE"),
        ("open_files", "nofile", resource.RLIMIT_NOFILE, limits.open_files, "rlimit NOFILE"),
    ]
    if not memory_by_cgroup:
        wanted.append(
            ("memory_bytes", "as", resource.RLIMIT_AS, limits.memory_bytes,
             "rlimit AS (address space, per process; allocations fail)")
        )
    if not processes_by_cgroup and nproc_counts:
        wanted.append(
            ("max_processes", "nproc", resource.RLIMIT_NPROC, limits.max_processes,
             "rlimit NPROC (counts every process of the sandbox host uid)")
        )
    for field_name, flag, kind, value, how in wanted:
        if value is None:
            continue
        hard = resource.getrlimit(kind)[1]
        applied = value if hard == _INFINITY else min(value, hard)
        chosen.append((flag, kind, applied))
        enforced[field_name] = how if applied == value else f"{how}, clamped to host hard limit {hard}"
    return RlimitPlan(limits=tuple(chosen), enforced=enforced)
