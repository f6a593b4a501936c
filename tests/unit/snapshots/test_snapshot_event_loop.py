"""Snapshot work never runs on the event loop, and 50 sessions persisting at once do not stall it
(issue 4, style: async boundaries)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from cairn.snapshots import (
    ContentAddressedSnapshotStore,
    LocalObjectStore,
    PersistRequest,
    SnapshotScope,
    WorkspaceLifecycle,
)

pytestmark = pytest.mark.anyio


async def test_blocking_work_runs_on_worker_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop_thread = threading.get_ident()
    ran_on: dict[str, int] = {}

    def recording(name: str, function: Callable[..., object]) -> Callable[..., object]:
        def wrapper(*args: object, **kwargs: object) -> object:
            ran_on[name] = threading.get_ident()
            return function(*args, **kwargs)

        return wrapper

    for module, name in [
        ("cairn.snapshots.content_store", "persist_workspace"),
        ("cairn.snapshots.content_store", "restore_workspace"),
        ("cairn.snapshots.lifecycle", "fingerprint_workspace"),
    ]:
        target = __import__(module, fromlist=[name])
        monkeypatch.setattr(target, name, recording(name, getattr(target, name)))
    store = ContentAddressedSnapshotStore(LocalObjectStore(tmp_path / "store"), max_workers=1)
    scope = SnapshotScope("tenant", "session")
    workspace = tmp_path / "ws"
    cycle = WorkspaceLifecycle(store=store, scope=scope, workspace=workspace, manifest_digest="m")
    await cycle.start()
    (workspace / "file").write_text("x")
    await cycle.stop()
    await cycle.start()
    await cycle.stop()
    await store.restore(scope, tmp_path / "elsewhere")
    await store.aclose()
    assert set(ran_on) == {"persist_workspace", "restore_workspace", "fingerprint_workspace"}
    assert loop_thread not in ran_on.values()


async def test_50_concurrent_persists_run_bounded_and_off_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most `max_operations` persists run at once (more threads doing Python work starve the
    loop of the GIL), and the loop keeps running while they do. The loop's lag itself is a figure
    of `benchmarks/snapshots.py`, not a timed assertion here."""
    import cairn.snapshots.content_store as content_store

    running, peak, ticks_while_running = 0, 0, 0
    guard = threading.Lock()
    original = content_store.persist_workspace

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal running, peak
        with guard:
            running += 1
            peak = max(peak, running)
        try:
            return original(*args, **kwargs)
        finally:
            with guard:
                running -= 1

    monkeypatch.setattr(content_store, "persist_workspace", counted)
    store = ContentAddressedSnapshotStore(LocalObjectStore(tmp_path / "store"), max_workers=4, max_operations=2)
    workspaces = []
    for index in range(50):
        workspace = tmp_path / f"ws-{index}"
        workspace.mkdir()
        for number in range(20):
            (workspace / f"file-{number}").write_bytes(os.urandom(16 * 1024))
        (workspace / "large").write_bytes(os.urandom(9 * 1024 * 1024 if index % 10 == 0 else 1000))
        workspaces.append(workspace)
    done = anyio.Event()

    async def ticker() -> None:
        # A persist run on the loop thread would start and end between two ticks: never seen running.
        nonlocal ticks_while_running
        while not done.is_set():
            await anyio.sleep(0.001)
            ticks_while_running += running > 0

    async def persist(index: int) -> None:
        scope = SnapshotScope("tenant", f"session-{index}")
        await store.persist(PersistRequest(scope=scope, workspace=workspaces[index], manifest_digest="m"))

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(ticker)
            async with anyio.create_task_group() as persists:
                for index in range(50):
                    persists.start_soon(persist, index)
            done.set()
        for index in range(50):
            assert len(await store.list_snapshots(SnapshotScope("tenant", f"session-{index}"))) == 1
    finally:
        await store.aclose()
    assert peak <= 2
    assert ticks_while_running > 0
