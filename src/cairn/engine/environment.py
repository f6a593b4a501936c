"""Session workspaces on the host: where they live, how they are created and removed.

Each session with a hosted environment owns `<data-dir>/workspaces/<session_id>`, which
the sandbox shows as `/workspace`. Inline files of the environment are written when the
workspace is created.
"""

from __future__ import annotations

import base64
import binascii
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cairn._concurrency import run_sync
from cairn.engine.workspace_files import WorkspaceFiles, workspace_relative
from cairn.errors import InvalidRequestError
from cairn.sandbox.base import SandboxBackend

__all__ = ["Environments", "decode_inline_files"]


def decode_inline_files(files: Sequence[Mapping[str, Any]]) -> list[tuple[str, bytes]]:
    """Validate `environment.files` (inline only) before anything is created."""
    decoded = []
    for index, spec in enumerate(files):
        if spec.get("type") != "inline":
            raise InvalidRequestError(
                "only inline environment files are supported (file_id needs the Files API)",
                param=f"environment.files[{index}].type",
            )
        try:
            data = base64.b64decode(spec["data"], validate=True)
        except (binascii.Error, KeyError, TypeError) as exc:
            raise InvalidRequestError("inline file data must be base64", param=f"environment.files[{index}].data") from exc
        path = str(spec.get("path", ""))
        try:
            workspace_relative(path)
        except InvalidRequestError as exc:
            raise InvalidRequestError(exc.message, param=f"environment.files[{index}].path") from exc
        decoded.append((path, data))
    return decoded


class Environments:
    def __init__(self, root: Path, sandbox: SandboxBackend) -> None:
        self.root = root
        self.sandbox = sandbox

    def workspace_of(self, session_id: str) -> Path:
        return self.root / session_id

    def files(self, session_id: str) -> WorkspaceFiles:
        owner = getattr(self.sandbox, "file_owner", None)
        return WorkspaceFiles(self.workspace_of(session_id), owner=owner)

    async def create(self, session_id: str, inline_files: Sequence[tuple[str, bytes]] = ()) -> Path:
        workspace = self.workspace_of(session_id)
        await run_sync(workspace.mkdir, parents=True, exist_ok=True)
        await self.sandbox.prepare_workspace(workspace)
        files = self.files(session_id)
        for path, data in inline_files:
            await run_sync(files.write_bytes, path, data)
        return workspace

    async def ensure(self, session_id: str) -> Path:
        """The workspace, created empty if it is missing (for example after a host change)."""
        workspace = self.workspace_of(session_id)
        if not await run_sync(workspace.is_dir):
            return await self.create(session_id)
        return workspace

    async def remove(self, session_id: str) -> None:
        await run_sync(_remove_tree, self.workspace_of(session_id))


def _remove_tree(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
