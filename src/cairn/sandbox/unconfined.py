"""The unconfined backend: commands run directly on the host, as the server's user.

It isolates nothing (design invariant 8) and exists only for operators who opt in by name
(`select_backend("unconfined")`), e.g. on a development machine without bubblewrap. It says
so in `isolation`, logs a warning for every workspace it prepares, and is never chosen
automatically. There is no `/workspace` mount: commands run in the real host directory of
the workspace and see (and must use) its host path.

Resource limits and tree cleanup are the same as for the other backends (cgroups where
writable, rlimits otherwise), through the same launcher (no seccomp, no uid change).
Without a cgroup, a background process that leaves the command's process group with
`setsid` can outlive the command; `limits_in_force` says whether one is available.
"""

from __future__ import annotations

import logging
import os
import pwd
from collections.abc import Mapping
from pathlib import Path

from cairn.sandbox._cgroups import discover_cgroups
from cairn.sandbox._containment import Containment
from cairn.sandbox._env import ENV_ISOLATION, command_env
from cairn.sandbox._launch import LaunchedBackend
from cairn.sandbox.base import ExecRequest

__all__ = ["UnconfinedBackend"]

logger = logging.getLogger(__name__)

_WARNING = "sandbox backend 'unconfined' isolates nothing: commands run on the host as %s"


class UnconfinedBackend(LaunchedBackend):
    """Runs `/bin/sh -c <command>` on the host in the workspace directory; see module docstring."""

    name = "unconfined"
    seccomp = False

    def __init__(self, *, containment: Containment | None = None) -> None:
        super().__init__(
            account=None,
            containment=containment or Containment(cgroups=discover_cgroups(), nproc_counts=False),
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
            "environment": ENV_ISOLATION,
        }

    async def prepare_workspace(self, workspace: Path) -> None:
        await super().prepare_workspace(workspace)
        logger.warning(_WARNING + " (workspace %s)", self._user, workspace)

    def _command(
        self, request: ExecRequest, scratch: Path | None
    ) -> tuple[list[str], dict[str, str], str]:
        env = command_env(home=str(request.workspace), user=_login_name(), session_env=request.env)
        return ["/bin/sh", "-c", request.command], env, str(request.workspace)


def _login_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid{os.geteuid()}"  # a uid without a passwd entry still needs a USER
