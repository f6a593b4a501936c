"""The shared body of every backend: a command is a `LaunchSpec` run by the fork server.

A backend says what the command runs (`_command`: argv, env, working directory), how it
is confined (`_confinement`: a rootfs, Landlock rules, or nothing beyond what the argv
itself does, as bwrap does) and, if it keeps one, which running container the command
joins (`_container`); this class adds the command's cgroup leaves, rlimits and user
(`_containment.py`, `_account.py`), hands the spec to the backend's fork server
(`_forkserver.py`) and supervises the command (`_process.py`). The steps the child takes
are in `_launcher/main.py`.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from cairn._concurrency import run_sync
from cairn.errors import SandboxError
from cairn.sandbox._account import SandboxAccount
from cairn.sandbox._containment import CommandContainment, Containment
from cairn.sandbox._forkserver import ForkServer
from cairn.sandbox._launcher.main import LAUNCH_FAILED
from cairn.sandbox._process import run_supervised
from cairn.sandbox._workspace import WorkspaceIdentity, hand_over_workspace, workspace_identity
from cairn.sandbox.base import ExecRequest, ExecResult, OutputSink, ResourceLimits, SandboxBackend

if TYPE_CHECKING:
    from cairn.sandbox._launcher.spec import Landlock, LaunchSpec, Rootfs

__all__ = ["Handoff", "LaunchedBackend"]

_PROBE_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Handoff:
    """Two descriptors the launched program inherits (at `PASSED_FD` and `PASSED_FD + 1`)
    and what to do once it started, before it is supervised: bwrap's per-command egress
    door (`bwrap.py`)."""

    fds: tuple[int, int]
    started: Callable[[], Awaitable[None]]


class LaunchedBackend(SandboxBackend):
    """Shared `exec`, limits and workspace hand-over; subclasses say what runs and how."""

    # Install the launcher's seccomp denylist (bwrap confines itself; unconfined does not).
    seccomp: ClassVar[bool] = True

    def __init__(self, *, account: SandboxAccount | None, containment: Containment) -> None:
        self._account = account
        self._containment = containment
        self._forks = ForkServer()

    @abc.abstractmethod
    def _command(
        self, request: ExecRequest, scratch: Path | None
    ) -> tuple[list[str], dict[str, str], str]:
        """argv, environment and working directory of the process the launcher execs."""

    def _files(self, request: ExecRequest) -> list[tuple[int, str | bytes]]:
        """Descriptors the launched program inherits (`LaunchSpec.files`); by default none."""
        return []

    def _confinement(
        self, request: ExecRequest, scratch: Path | None
    ) -> tuple[Rootfs | None, Landlock | None]:
        """The rootfs (namespaces) or Landlock rules (landlock) for one command; by default none."""
        return None, None

    @asynccontextmanager
    async def _scratch(self) -> AsyncIterator[Path | None]:
        """A private writable directory for one command, if the backend needs one."""
        yield None

    @asynccontextmanager
    async def _container(
        self, request: ExecRequest, identity: WorkspaceIdentity
    ) -> AsyncIterator[int | None]:
        """The running container the command joins (its init's pidfd, which the launcher
        receives as `PASSED_FD`), held for the command's whole life; by default none."""
        yield None

    @asynccontextmanager
    async def _handoff(self, request: ExecRequest) -> AsyncIterator[Handoff | None]:
        """What a command that joins no container is handed besides its spec, held for its
        whole life; by default nothing."""
        yield None

    @property
    def limits_in_force(self) -> Mapping[str, str]:
        return self._containment.limits_in_force()

    @property
    def file_owner(self) -> tuple[int, int] | None:
        return None if self._account is None else (self._account.uid, self._account.gid)

    async def prepare_workspace(self, workspace: Path) -> None:
        """Check the sandbox account can reach `workspace`, then give it the workspace's files."""
        await run_sync(hand_over_workspace, workspace, self._account)

    async def exec(self, request: ExecRequest, on_output: OutputSink) -> ExecResult:
        if request.network and "isolation" in self.capabilities and "egress" not in self.capabilities:
            # Fail closed: without the proxy, network would mean the host's own network.
            raise SandboxError(
                f"the {self.name} backend cannot give commands network access: that needs Cairn's egress "
                "proxy, which needs the bwrap backend (see `cairn doctor`)",
                code="network_unavailable",
            )
        async with (
            self._containment.command(request.limits, request.workspace) as contained,
            self._scratch() as scratch,
            self._container(request, contained.workspace) as container,
            self._handoff(request) as handoff,
        ):
            spec = self._spec(request, contained, scratch)
            if handoff is None:
                command = self._forks.start(spec, container, joins=container is not None)
            else:
                command = self._forks.start(spec, handoff.fds[0], next_fd=handoff.fds[1])
                try:
                    await handoff.started()
                except BaseException:
                    command.kill()
                    command.close()
                    raise
            return await run_supervised(
                command,
                timeout_s=request.timeout_s,
                on_output=on_output,
                reap_leftovers=contained.reap_leftovers,
            )

    def _spec(
        self, request: ExecRequest, contained: CommandContainment, scratch: Path | None
    ) -> LaunchSpec:
        argv, env, cwd = self._command(request, scratch)
        rootfs, landlock = self._confinement(request, scratch)
        return {
            "argv": argv,
            "env": env,
            "cwd": cwd,
            "workspace": str(request.workspace),
            "cgroup_join": contained.cgroup_join,
            "rlimits": contained.rlimits.values,
            "user": None if self._account is None else (self._account.uid, self._account.gid),
            "network": request.network,
            "seccomp": self.seccomp,
            "files": self._files(request),
            "rootfs": rootfs,
            "landlock": landlock,
            "join": None,
        }

    def _probe(self, workspace: Path, scratch: Path | None, container: int | None = None) -> None:
        """Run `true` the way every command runs (joining `container`, if given); raise
        `SandboxError` with why it failed.

        Blocking (call at startup, no event loop needed). It runs without cgroups, so a
        probe leaves nothing behind.
        """
        hand_over_workspace(workspace, self._account)
        request = ExecRequest(command="true", workspace=workspace, timeout_s=_PROBE_TIMEOUT_S,
                              limits=ResourceLimits(memory_bytes=None, max_processes=None))
        contained = CommandContainment(
            cgroup=None,
            rlimits=self._containment.rlimit_plan(request.limits),
            workspace=workspace_identity(workspace),
        )
        spec = self._spec(request, contained, scratch)
        command = self._forks.start(spec, container, joins=container is not None)
        try:
            returncode, output = command.run_blocking(_PROBE_TIMEOUT_S)
        finally:
            command.close()
        if returncode != 0:
            reason = output.decode(errors="replace").strip()
            if returncode != LAUNCH_FAILED:
                reason = f"exit status {returncode}: {reason}"
            raise SandboxError(
                f"the {self.name} backend cannot create a sandbox on this host: {reason}",
                context={"returncode": returncode},
            )
