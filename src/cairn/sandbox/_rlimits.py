"""Per-command rlimits: the floor under every backend's resource limits.

RLIMIT_FSIZE, RLIMIT_CPU and RLIMIT_NOFILE always, and RLIMIT_AS / RLIMIT_NPROC only where
no cgroup enforces memory / process count (an address space limit breaks runtimes that
reserve large mappings, and NPROC counts every process of a host uid, not of one command).
Every backend's launcher (`_launcher/main.py`) calls setrlimit with them before the
sandbox starts.
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

    # (resource.RLIMIT_*, value used as both soft and hard limit)
    values: list[tuple[int, int]]
    enforced: dict[str, str]


def plan_rlimits(
    limits: ResourceLimits, *, memory_by_cgroup: bool, processes_by_cgroup: bool, nproc_counts: bool
) -> RlimitPlan:
    """Choose rlimits for `limits`; fields already enforced by a cgroup are left to it.

    `nproc_counts` is False when RLIMIT_NPROC would not bound the command (host uid 0 is
    exempt) or would count unrelated processes of the server's own user.
    """
    chosen: list[tuple[int, int]] = []
    enforced: dict[str, str] = {}
    wanted: list[tuple[str, int, int | None, str]] = [
        ("cpu_time_s", resource.RLIMIT_CPU, limits.cpu_time_s, "rlimit CPU, per process"),
        ("file_size_bytes", resource.RLIMIT_FSIZE, limits.file_size_bytes, "rlimit FSIZE"),
        ("open_files", resource.RLIMIT_NOFILE, limits.open_files, "rlimit NOFILE"),
    ]
    if not memory_by_cgroup:
        wanted.append(
            ("memory_bytes", resource.RLIMIT_AS, limits.memory_bytes,
             "rlimit AS (address space, per process; allocations fail)")
        )
    if not processes_by_cgroup and nproc_counts:
        wanted.append(
            ("max_processes", resource.RLIMIT_NPROC, limits.max_processes,
             "rlimit NPROC (counts every process of the sandbox host uid)")
        )
    for field_name, kind, value, how in wanted:
        if value is None:
            continue
        hard = resource.getrlimit(kind)[1]
        applied = value if hard == _INFINITY else min(value, hard)
        chosen.append((kind, applied))
        enforced[field_name] = how if applied == value else f"{how}, clamped to host hard limit {hard}"
    return RlimitPlan(values=chosen, enforced=enforced)
