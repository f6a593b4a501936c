"""Session workspaces on the host and their snapshot lifecycle.

Each session with a hosted environment owns `<data-dir>/workspaces/<session_id>`, which the
sandbox shows as `/workspace`. Workspaces live only where turns run (the worker): a turn
`acquire`s the workspace, and the snapshot lifecycle reuses it (fingerprint unchanged),
restores it from the latest snapshot, or materialises it fresh, seeded once with the inline
files the session stored at create. An idle session is `suspend`ed: its workspace is persisted as a new snapshot (stop
only persists) and its lifecycle released, and so is what the sandbox keeps for it (a
session container). The files stay on disk, so the next turn's start is usually a skip;
on another host, or after the directory was lost, it is a restore.
Lifecycles live in the process that runs the session's turns (the job lease makes that
exclusive); a restart simply starts a new one.
"""

from __future__ import annotations

import base64
import binascii
import shutil
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from cairn._concurrency import run_sync
from cairn.engine.artifacts import OUTPUTS_DIR
from cairn.engine.workspace_files import WorkspaceFiles, workspace_relative
from cairn.errors import InvalidRequestError
from cairn.sandbox.base import WORKSPACE_MOUNT, SandboxBackend
from cairn.snapshots import (
    SnapshotScope,
    SnapshotStore,
    StartResult,
    StopResult,
    WorkspaceLifecycle,
    environment_manifest_digest,
)
from cairn.store.db import Database
from cairn.store.session_files import load_session_files

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
        param = f"environment.files[{index}].path"
        try:
            relative = workspace_relative(path)
        except InvalidRequestError as exc:
            raise InvalidRequestError(exc.message, param=param) from exc
        if path.endswith("/") or not relative:
            raise InvalidRequestError(f"path {path!r} names a directory; an inline file needs a file name", param=param)
        if relative == OUTPUTS_DIR:
            raise InvalidRequestError(
                f"{WORKSPACE_MOUNT}/{OUTPUTS_DIR} is the directory whose files become artifacts; put files inside it",
                param=param,
            )
        decoded.append((path, data))
    return decoded


class Environments:
    def __init__(self, root: Path, sandbox: SandboxBackend, snapshots: SnapshotStore, db: Database) -> None:
        self.root = root
        self.sandbox = sandbox
        self.snapshots = snapshots
        self.db = db
        self._live: dict[str, WorkspaceLifecycle] = {}
        self._locks: dict[str, anyio.Lock] = {}

    def workspace_of(self, session_id: str) -> Path:
        return self.root / session_id

    def files(self, session_id: str) -> WorkspaceFiles:
        return WorkspaceFiles(self.workspace_of(session_id), owner=self.sandbox.file_owner)

    def _lock(self, session_id: str) -> anyio.Lock:
        return self._locks.setdefault(session_id, anyio.Lock())

    def _seeded_marker(self, session_id: str) -> Path:
        return self.root / f".{session_id}.cairn-seeded"

    async def _materialise(self, session_id: str, workspace: Path) -> None:
        """Make a fresh workspace, with the session's inline files the first time.

        Later fresh starts (no snapshot yet, say after a restart) find the marker and leave
        the files as the agent left them; a crash before the marker is written seeds again.
        """
        await run_sync(workspace.mkdir, parents=True, exist_ok=True)
        await self.sandbox.prepare_workspace(workspace)
        marker = self._seeded_marker(session_id)
        if await run_sync(marker.exists):
            return
        async with self.db.read() as conn:
            seed = await load_session_files(conn, session_id)
        files = self.files(session_id)
        for path, data in seed:
            await run_sync(files.write_bytes, path, data)
        await run_sync(marker.touch)

    def live_sessions(self) -> list[str]:
        return list(self._live)

    async def acquire(self, tenant: str, session_id: str, environment: Mapping[str, Any]) -> StartResult | None:
        """Make the workspace ready for a turn; None when it is already live in this process."""
        async with self._lock(session_id):
            if session_id in self._live:
                return None
            workspace = self.workspace_of(session_id)
            lifecycle = WorkspaceLifecycle(
                store=self.snapshots,
                scope=SnapshotScope(tenant, session_id),
                workspace=workspace,
                manifest_digest=environment_manifest_digest(environment),
                materialise=partial(self._materialise, session_id),
            )
            result = await lifecycle.start()
            # A restore writes files as they were saved; make sure the sandbox account owns them.
            await self.sandbox.prepare_workspace(workspace)
            self._live[session_id] = lifecycle
            return result

    async def suspend(self, session_id: str) -> StopResult | None:
        """Persist the workspace as a snapshot and release its lifecycle; None if it was not live."""
        async with self._lock(session_id):
            lifecycle = self._live.get(session_id)
            if lifecycle is None:
                return None
            result = await lifecycle.stop()
            await lifecycle.shutdown()
            del self._live[session_id]
            await self.sandbox.release_workspace(self.workspace_of(session_id))
            return result

    async def forget(self, session_id: str) -> None:
        """Release a live workspace of a session that no longer exists, without persisting it
        (the process that removed it, through a `remove_workspace` job, may be another)."""
        async with self._lock(session_id):
            lifecycle = self._live.pop(session_id, None)
            if lifecycle is not None:
                await lifecycle.shutdown()
                await self.sandbox.release_workspace(self.workspace_of(session_id))

    async def remove(self, tenant: str, session_id: str) -> None:
        """Forget a deleted session's workspace: no persist; the directory and snapshots go."""
        async with self._lock(session_id):
            lifecycle = self._live.pop(session_id, None)
            if lifecycle is not None:
                await lifecycle.shutdown()
            await self.sandbox.release_workspace(self.workspace_of(session_id))
            await run_sync(_remove_tree, self.workspace_of(session_id), self._seeded_marker(session_id))
            await self.snapshots.forget(SnapshotScope(tenant, session_id))
        self._locks.pop(session_id, None)


def _remove_tree(path: Path, marker: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.with_name(f".{path.name}.cairn-state.json").unlink(missing_ok=True)
    marker.unlink(missing_ok=True)
