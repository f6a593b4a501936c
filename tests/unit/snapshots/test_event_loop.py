"""50 sessions persisting at once must not stall the event loop (issue 4, style: async boundaries)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import pytest

from cairn.snapshots import ContentAddressedSnapshotStore, LocalObjectStore, PersistRequest, SnapshotScope

pytestmark = pytest.mark.anyio


async def test_50_concurrent_persists_keep_the_loop_responsive(tmp_path: Path) -> None:
    store = ContentAddressedSnapshotStore(LocalObjectStore(tmp_path / "store"), max_workers=4)
    workspaces = []
    for index in range(50):
        workspace = tmp_path / f"ws-{index}"
        workspace.mkdir()
        for number in range(20):
            (workspace / f"file-{number}").write_bytes(os.urandom(16 * 1024))
        (workspace / "large").write_bytes(os.urandom(9 * 1024 * 1024 if index % 10 == 0 else 1000))
        workspaces.append(workspace)
    worst_lag = 0.0
    done = anyio.Event()

    async def ticker() -> None:
        nonlocal worst_lag
        while not done.is_set():
            before = time.perf_counter()
            await anyio.sleep(0.005)
            worst_lag = max(worst_lag, time.perf_counter() - before - 0.005)

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
    finally:
        await store.aclose()
    assert worst_lag < 0.1, f"the event loop stalled for {worst_lag:.3f} s"
