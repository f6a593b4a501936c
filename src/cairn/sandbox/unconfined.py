"""The unconfined backend: commands run directly on the host, as the server's user.

It isolates nothing (design invariant 8) and exists only for operators who opt in by name
(`select_backend("unconfined")`), e.g. on a development machine without bubblewrap. It says
so in `isolation`, logs a warning for every workspace it prepares, and is never chosen
automatically. There is no `/workspace` mount: commands run in the real host directory of
the workspace and see (and must use) its host path.

Resource limits and tree cleanup are the same as for bwrap (cgroups where writable,
rlimits otherwise). Without a pids cgroup, a background process that leaves the command's
process group with `setsid` can outlive the command; `limits_in_force` says whether one is
available.
"""

from __future__ import annotations

import logging
import os
import pwd
from collections.abc import Mapping
from pathlib import Path

from cairn._concurrency import run_sync
from cairn.errors import WorkspaceError
from cairn.sandbox._cgroups import discover_cgroups
from cairn.sandbox._containment import Containment
from cairn.sandbox._env import command_env
from cairn.sandbox._process import Launch, run_supervised
from cairn.sandbox.base import ExecRequest, ExecResult, OutputSink, SandboxBackend

__all__ = ["UnconfinedBackend"]

logger = logging.getLogger(__name__)

_WARNING = "sandbox backend 'unconfined' isolates nothing: commands run on the host as %s"


class UnconfinedBackend(SandboxBackend):
    """Runs `/bin/sh -c <command>` on the host in the workspace directory; see module docstring."""

    name = "unconfined"

    def __init__(self, *, containment: Containment | None = None) -> None:
        self._containment = containment or Containment(
            cgroups=discover_cgroups(), nproc_counts=False
        )
        self._user = f"uid {os.geteuid()}"
        logger.warning(_WARNING, self._user)

    @property
    def isolation(self) -> Mapping[str, str]:
        return {
            "backend": "unconfined",
            "isolation": (
                "NONE: commands run directly on the host as the server's user "
                f"({self._user}); they can read and write anything it can, use its network "
                "and see its processes. Enabled explicitly by the operator."
            ),
            "filesystem": "none; commands see the workspace at its real host path, not /workspace",
            "environment": "fixed allowlist plus the session's env; nothing from the server",
        }

    @property
    def limits_in_force(self) -> Mapping[str, str]:
        return self._containment.limits_in_force()

    async def prepare_workspace(self, workspace: Path) -> None:
        if not await run_sync(workspace.is_dir):
            raise WorkspaceError(f"workspace {workspace} is not a directory")
        logger.warning(_WARNING + " (workspace %s)", self._user, workspace)

    async def exec(self, request: ExecRequest, on_output: OutputSink) -> ExecResult:
        if not await run_sync(request.workspace.is_dir):
            raise WorkspaceError(f"workspace {request.workspace} is not a directory")
        env = command_env(
            home=str(request.workspace), user=_login_name(), session_env=request.env
        )
        async with self._containment.command(request.limits) as contained:
            launch = Launch(
                argv=[*contained.exec_prefix(None), "/bin/sh", "-c", request.command],
                env=env,
                cwd=request.workspace,
            )
            return await run_supervised(
                launch,
                timeout_s=request.timeout_s,
                on_output=on_output,
                reap_leftovers=contained.reap_leftovers,
            )


def _login_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid{os.geteuid()}"  # a uid without a passwd entry still needs a USER
