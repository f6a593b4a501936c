"""Backends whose commands start through Cairn's own launcher (`_launcher/`), not bwrap.

The server writes the command's `LaunchSpec` into a memfd and runs the launcher in a fresh
interpreter (`-I -S -B`: no site-packages, no environment, no cwd on the path) that loads
the `_launcher` directory as a package of its own, so none of the server's modules (or
their import time) come along. The spec travels in a file descriptor, not argv, so the
session's env is never on a command line. Output, timeout, cancellation and tree cleanup
are the shared supervisor's (`_process.py`); limits are `_containment.py`'s.
"""

from __future__ import annotations

import abc
import marshal
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from cairn._concurrency import run_sync
from cairn.errors import SandboxError, WorkspaceError
from cairn.sandbox import _launcher
from cairn.sandbox._account import SandboxAccount
from cairn.sandbox._containment import CommandContainment, Containment
from cairn.sandbox._env import DEFAULT_PATH, command_env
from cairn.sandbox._launcher.main import LAUNCH_FAILED
from cairn.sandbox._process import Launch, run_supervised
from cairn.sandbox._rootfs import SANDBOX_USER
from cairn.sandbox._workspace import hand_over_workspace
from cairn.sandbox.base import ExecRequest, ExecResult, OutputSink, ResourceLimits, SandboxBackend

if TYPE_CHECKING:
    from cairn.sandbox._launcher.spec import Landlock, LaunchSpec, Rootfs

__all__ = ["LaunchedBackend"]

_LAUNCHER_DIR = str(Path(_launcher.__file__).parent)
# Loads the `_launcher` directory as package `cairn_launcher` and runs it. The import
# machinery comes from the frozen modules every interpreter has loaded already:
# `importlib.util` would import `contextlib` and `collections`, ~5 ms of start-up.
_BOOTSTRAP = (
    "import sys\n"
    "from _frozen_importlib import module_from_spec\n"
    "from _frozen_importlib_external import spec_from_file_location\n"
    "d = sys.argv[1]\n"
    "s = spec_from_file_location('cairn_launcher', d + '/__init__.py', "
    "submodule_search_locations=[d])\n"
    "m = module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m)\n"
    "from cairn_launcher.main import main\n"
    "main(int(sys.argv[2]))\n"
)
_PROBE_TIMEOUT_S = 30.0


class LaunchedBackend(SandboxBackend):
    """Shared `exec` for launcher-based backends; subclasses say how a command is confined."""

    def __init__(self, *, account: SandboxAccount | None, containment: Containment) -> None:
        self._account = account
        self._containment = containment

    @abc.abstractmethod
    def _confinement(
        self, request: ExecRequest, scratch: Path | None
    ) -> tuple[Rootfs | None, Landlock | None]:
        """The rootfs (namespaces) or Landlock rules (landlock) for one command."""

    @abc.abstractmethod
    def _paths(self, request: ExecRequest, scratch: Path | None) -> tuple[str, str, str]:
        """The command's working directory, HOME and TMPDIR, as the command sees them."""

    @asynccontextmanager
    async def _scratch(self) -> AsyncIterator[Path | None]:
        """A private writable directory for one command, if the backend needs one."""
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
        if not await run_sync(request.workspace.is_dir):
            raise WorkspaceError(f"workspace {request.workspace} is not a directory")
        async with self._containment.command(request.limits) as contained:
            async with self._scratch() as scratch:
                spec = self._spec(request, contained, scratch)
                with _spec_fd(spec) as launch:
                    return await run_supervised(
                        launch,
                        timeout_s=request.timeout_s,
                        on_output=on_output,
                        reap_leftovers=contained.reap_leftovers,
                    )

    def _spec(
        self, request: ExecRequest, contained: CommandContainment, scratch: Path | None
    ) -> LaunchSpec:
        cwd, home, tmpdir = self._paths(request, scratch)
        env = command_env(home=home, user=SANDBOX_USER, session_env=request.env, tmpdir=tmpdir)
        rootfs, landlock = self._confinement(request, scratch)
        return {
            "argv": ["/bin/sh", "-c", request.command],
            "env": env,
            "cwd": cwd,
            "workspace": str(request.workspace),
            "cgroup_procs": contained.cgroup_procs,
            "rlimits": contained.rlimits.values,
            "user": None if self._account is None else (self._account.uid, self._account.gid),
            "network": request.network,
            "rootfs": rootfs,
            "landlock": landlock,
        }

    def _probe(self, workspace: Path, scratch: Path | None) -> None:
        """Run `true` the way every command runs; raise `SandboxError` with why it failed.

        Blocking (call at startup). It runs without cgroups: a probe leaves nothing behind.
        """
        hand_over_workspace(workspace, self._account)
        request = ExecRequest(command="true", workspace=workspace, timeout_s=_PROBE_TIMEOUT_S,
                              limits=ResourceLimits(memory_bytes=None, max_processes=None))
        contained = CommandContainment(
            cgroup=None, rlimits=self._containment.rlimit_plan(request.limits),
            prlimit=None, setpriv=None,
        )
        with _spec_fd(self._spec(request, contained, scratch)) as launch:
            try:
                done = subprocess.run(
                    list(launch.argv), capture_output=True, env=dict(launch.env), cwd=launch.cwd,
                    pass_fds=launch.pass_fds, timeout=_PROBE_TIMEOUT_S, check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise SandboxError(f"the {self.name} launcher could not run: {exc}") from exc
        if done.returncode != 0:
            reason = (done.stdout + done.stderr).decode(errors="replace").strip()
            if done.returncode != LAUNCH_FAILED:
                reason = f"exit status {done.returncode}: {reason}"
            raise SandboxError(
                f"the {self.name} backend cannot create a sandbox on this host: {reason}",
                context={"returncode": done.returncode},
            )


@contextmanager
def _spec_fd(spec: LaunchSpec) -> Iterator[Launch]:
    """The launcher's `Launch`, with `spec` in a memfd that is closed again on exit."""
    fd = os.memfd_create("cairn-launch-spec")
    try:
        os.write(fd, marshal.dumps(dict(spec)))
        os.lseek(fd, 0, os.SEEK_SET)
        yield Launch(
            argv=[sys.executable, "-I", "-S", "-B", "-c", _BOOTSTRAP, _LAUNCHER_DIR, str(fd)],
            env={"PATH": DEFAULT_PATH},
            cwd=Path("/"),
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)
