"""The dedicated unprivileged host account that sandboxed commands run as.

When the server runs as root, commands must not: bwrap launched by root maps the sandbox
user onto host root, so every file a command writes is root-owned on the host and a bind
mount mistake becomes a host write (research/sandbox.md §1). Launching the sandbox as an
unprivileged host uid gives a real host boundary, makes RLIMIT_NPROC count, and leaves
workspace files owned by that uid. A server that is not root runs commands as itself.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from cairn.errors import WorkspaceError

__all__ = ["DEDICATED_USER", "SandboxAccount", "resolve_sandbox_account"]

# Operators create this system user (`useradd --system --no-create-home cairn-sandbox`);
# without it Cairn falls back to `nobody` and says so in `cairn doctor`.
DEDICATED_USER = "cairn-sandbox"
_NOBODY = 65534


@dataclass(frozen=True, slots=True)
class SandboxAccount:
    """A host uid/gid that commands run as; `is_dedicated` is False for the `nobody` fallback."""

    uid: int
    gid: int
    name: str
    is_dedicated: bool

    def describe(self) -> str:
        suffix = "" if self.is_dedicated else f" (no `{DEDICATED_USER}` user; shared fallback)"
        return f"host uid {self.uid} gid {self.gid} ({self.name}){suffix}"

    def check_reachable(self, workspace: Path) -> None:
        """Raise unless this account can traverse every ancestor of `workspace`.

        bwrap resolves the bind source as the sandbox uid, so a 0700 ancestor (such as
        /root or pytest's /tmp/pytest-of-root) makes every command fail; say which one.
        """
        for ancestor in reversed(workspace.resolve().parents):
            info = ancestor.stat()
            if not self._may_search(info):
                raise WorkspaceError(
                    f"the sandbox account ({self.describe()}) cannot traverse {ancestor}; "
                    "keep workspaces under a directory it can reach (e.g. chmod o+x "
                    f"{ancestor}, or a data dir such as /var/lib/cairn)",
                    context={"workspace": str(workspace), "blocked_at": str(ancestor)},
                )

    def _may_search(self, info: os.stat_result) -> bool:
        if info.st_uid == self.uid:
            return bool(info.st_mode & stat.S_IXUSR)
        if info.st_gid == self.gid:
            return bool(info.st_mode & stat.S_IXGRP)
        return bool(info.st_mode & stat.S_IXOTH)


def resolve_sandbox_account() -> SandboxAccount | None:
    """The account commands run as, or None when the server is unprivileged (runs as itself)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(DEDICATED_USER)
    except KeyError:
        return SandboxAccount(uid=_NOBODY, gid=_NOBODY, name="nobody", is_dedicated=False)
    return SandboxAccount(
        uid=entry.pw_uid, gid=entry.pw_gid, name=DEDICATED_USER, is_dedicated=True
    )
