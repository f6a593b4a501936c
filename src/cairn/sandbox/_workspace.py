"""Hands a workspace directory over to the sandbox account before commands run in it.

A restored snapshot or a workspace seeded by the server is owned by the server's user;
commands running as the sandbox account could not write it. Ownership is changed without
following symlinks, so a link planted in a previous life of the workspace cannot make the
server chown a host file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cairn.errors import WorkspaceError
from cairn.sandbox._account import SandboxAccount

__all__ = ["WorkspaceIdentity", "hand_over_workspace", "workspace_identity"]

# (st_dev, st_ino) of a workspace directory.
WorkspaceIdentity = tuple[int, int]


def workspace_identity(workspace: Path) -> WorkspaceIdentity:
    """(device, inode) of the workspace directory; `WorkspaceError` if it is not one.

    A backend that keeps a container bound to a workspace compares this before each
    command: a directory made again at the same path is a different workspace.
    """
    try:
        info = workspace.stat()
    except OSError as exc:
        raise WorkspaceError(f"workspace {workspace} is not a directory: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise WorkspaceError(f"workspace {workspace} is not a directory")
    return info.st_dev, info.st_ino


def hand_over_workspace(workspace: Path, account: SandboxAccount | None) -> None:
    """Make `workspace` and everything in it usable by `account` (None: the server itself)."""
    if not workspace.is_dir():
        raise WorkspaceError(f"workspace {workspace} is not a directory")
    if account is None:
        return
    account.check_reachable(workspace)
    try:
        os.lchown(workspace, account.uid, account.gid)
        for root, dirs, files in os.walk(workspace):
            for name in (*dirs, *files):
                os.lchown(os.path.join(root, name), account.uid, account.gid)
    except OSError as exc:
        raise WorkspaceError(f"could not hand workspace {workspace} to the sandbox: {exc}") from exc
