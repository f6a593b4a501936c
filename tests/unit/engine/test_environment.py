"""Workspaces are made where turns run, seeded once with the session's stored inline files."""

from __future__ import annotations

import base64

import pytest

from cairn.engine.environment import Environments
from cairn.engine.runtime import Runtime
from cairn.engine.sessions import SessionService
from cairn.snapshots import StartOutcome
from cairn.snapshots.noop import NoopSnapshotStore

pytestmark = pytest.mark.anyio

FILES = [
    {"type": "inline", "data": base64.b64encode(b"first\n").decode(), "path": "/workspace/a.txt"},
    {"type": "inline", "data": base64.b64encode(b"nested\n").decode(), "path": "src/deep/b.txt"},
]


async def _session(runtime: Runtime) -> str:
    created = await SessionService(runtime).create(
        "t1", {"agent": {"model": "scripted:x"}, "environment": {"type": "openai_hosted", "files": FILES}}
    )
    return created.session.id


async def test_creating_a_session_makes_no_workspace_and_the_first_acquire_seeds_it(runtime: Runtime) -> None:
    (runtime.settings.scripts_dir / "x.json").write_text('{"turns": []}')  # type: ignore[operator]
    session_id = await _session(runtime)
    workspace = runtime.environments.workspace_of(session_id)
    assert not workspace.exists()
    session = await SessionService(runtime).get("t1", session_id)
    started = await runtime.environments.acquire("t1", session_id, session.environment)
    assert started is not None and started.outcome is StartOutcome.FRESH
    assert (workspace / "a.txt").read_bytes() == b"first\n"
    assert (workspace / "src" / "deep" / "b.txt").read_bytes() == b"nested\n"


async def test_a_later_fresh_start_keeps_what_the_agent_made_of_the_seed(runtime: Runtime) -> None:
    # No snapshot store: every start after a restart is "fresh", on the same files.
    (runtime.settings.scripts_dir / "x.json").write_text('{"turns": []}')  # type: ignore[operator]
    environments = Environments(runtime.environments.root, runtime.sandbox, NoopSnapshotStore(), runtime.db)
    session_id = await _session(runtime)
    session = await SessionService(runtime).get("t1", session_id)
    await environments.acquire("t1", session_id, session.environment)
    workspace = environments.workspace_of(session_id)
    (workspace / "a.txt").write_bytes(b"changed by the agent\n")
    (workspace / "src" / "deep" / "b.txt").unlink()
    restarted = Environments(runtime.environments.root, runtime.sandbox, NoopSnapshotStore(), runtime.db)
    started = await restarted.acquire("t1", session_id, session.environment)
    assert started is not None and started.outcome is StartOutcome.FRESH
    assert (workspace / "a.txt").read_bytes() == b"changed by the agent\n"
    assert not (workspace / "src" / "deep" / "b.txt").exists()
    await restarted.remove("t1", session_id)
    assert not workspace.exists()
    # Removed (the session deleted): nothing of it is left beside the workspaces either.
    assert not any(p.name.startswith(f".{session_id}") for p in workspace.parent.iterdir())
