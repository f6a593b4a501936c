"""The sandbox interface: run one shell command against a session's workspace.

A `SandboxBackend` is a narrow transport: `exec` runs `/bin/sh -c <command>` with the
session's workspace directory visible as `/workspace` (the working directory), streams
output to a sink, and reports how it ended. Policy (which tool may run, approvals, the
ledger) lives in the engine.

Invariants every backend keeps (design invariant 8):
- cancellation of the awaiting task kills the whole process tree before `exec` returns;
- no process started by a command outlives `exec`;
- the host environment never leaks in: the command sees only `ExecRequest.env` plus a
  small fixed allowlist;
- a backend that does not isolate says so through `isolation` (never silently).
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from cairn.sandbox.egress.credentials import SessionEgress
from cairn.sandbox.egress.proxy import EgressProxy
from cairn.workspace import WORKSPACE_MOUNT

__all__ = [
    "ExecRequest",
    "ExecResult",
    "OutputSink",
    "ResourceLimits",
    "SandboxBackend",
    "WORKSPACE_MOUNT",
]

OutputSink = Callable[[bytes], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """Per-command limits; `None` means the backend's default."""

    memory_bytes: int | None = 1024 * 1024 * 1024
    max_processes: int | None = 256
    cpu_time_s: int | None = 600
    file_size_bytes: int | None = 1024 * 1024 * 1024
    open_files: int | None = 1024


@dataclass(frozen=True, slots=True)
class ExecRequest:
    command: str
    workspace: Path
    timeout_s: float
    env: Mapping[str, str] = field(default_factory=dict)
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    # The session's network (policy and credentials); None: no network at all.
    egress: SessionEgress | None = None

    @property
    def network(self) -> bool:
        return self.egress is not None


@dataclass(frozen=True, slots=True)
class ExecResult:
    """How a command ended. `exit_code` is None when it was killed by a signal or timeout.

    A backend that runs the command under a supervisor (bwrap) only learns the shell-style
    status `128 + signal` for a command the kernel killed (the OOM killer, RLIMIT_CPU);
    `signal` is set only for kills the backend itself performed (timeout, cancellation).
    """

    exit_code: int | None
    duration_s: float
    timed_out: bool = False
    signal: int | None = None


class SandboxBackend(abc.ABC):
    """Runs commands for sessions; one instance serves every session of a process.

    Declared `capabilities`: "isolation" (commands cannot reach host files, network or
    secrets beyond the workspace, nor signal host processes), "process_isolation" (host
    processes are not even visible: own pid namespace), "workspace_mount" (commands see the
    workspace at `WORKSPACE_MOUNT`, not at its host path), "egress" (a command with network
    reaches the outside only through Cairn's egress proxy; an isolating backend without it
    refuses commands with network).
    """

    name: ClassVar[str]
    capabilities: ClassVar[frozenset[str]] = frozenset()
    # How `select_backend` came to choose this backend; set once, at startup.
    selection: str = "named explicitly by the operator"

    @property
    def description(self) -> str:
        """One line for logs and the session's environment state: what runs commands, how
        strongly it isolates them, and why this backend was chosen."""
        if "isolation" not in self.capabilities:
            strength = "UNCONFINED: commands run directly on the host"
        elif "process_isolation" in self.capabilities:
            strength = "isolates files, network and processes"
        else:
            strength = "isolates files and network; host processes are visible, not reachable"
        return f"sandbox backend {self.name} ({strength}); {self.selection}"

    @property
    def isolation(self) -> Mapping[str, str]:
        """What this backend isolates, for `cairn doctor` and the session's environment state."""
        return {}

    @property
    def limits_in_force(self) -> Mapping[str, str]:
        """Which `ResourceLimits` fields this host actually enforces, and by what mechanism."""
        return {}

    @property
    def file_owner(self) -> tuple[int, int] | None:
        """Host (uid, gid) that owns files commands write, or None for the server's own.

        Host-side file tools (write_file, apply_patch) chown what they create to this owner,
        so a workspace never mixes owners and snapshots carry no root-owned surprises.
        """
        return None

    def use_egress(self, proxy: EgressProxy) -> None:
        """Route sandboxes' network through `proxy` (the one built from the operator's
        settings); a no-op for backends without the "egress" capability."""

    async def prepare_workspace(self, workspace: Path) -> None:
        """Make a freshly created workspace usable by sandboxed commands; no-op by default."""

    async def release_workspace(self, workspace: Path) -> None:
        """Release what the backend keeps for `workspace` between commands (a session
        container), because its session was suspended or deleted; no-op by default. A
        command still running in it is killed."""

    @abc.abstractmethod
    async def exec(self, request: ExecRequest, on_output: OutputSink) -> ExecResult:
        """Run `request.command` and stream its combined stdout/stderr to `on_output`."""
