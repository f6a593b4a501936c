"""Design invariant 7 under a real crash: `kill -9` of a process in the middle of a persist
leaves the previous snapshot the latest, restorable, and the debris collectable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio

from cairn.snapshots import ContentAddressedSnapshotStore, LocalObjectStore, Retention, SnapshotScope

CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import anyio
    from cairn.snapshots import ContentAddressedSnapshotStore, LocalObjectStore, PersistRequest, SnapshotScope

    store_dir, workspace = Path(sys.argv[1]), Path(sys.argv[2])
    scope = SnapshotScope("tenant", "session")

    def freeze_midway(done, total):
        # Called after the first chunk of new content reached a pack: announce, then hang.
        print("midway", flush=True)
        time.sleep(60)

    async def main():
        store = ContentAddressedSnapshotStore(LocalObjectStore(store_dir), max_workers=2)
        first = await store.persist(PersistRequest(scope=scope, workspace=workspace, manifest_digest="m"))
        print("persisted", first.snapshot.snapshot_id, flush=True)
        for name in ("big-1", "big-2", "small"):
            (workspace / name).write_bytes(os.urandom(12 * 1024 * 1024 if name != "small" else 100))
        await store.persist(
            PersistRequest(scope=scope, workspace=workspace, manifest_digest="m", progress=freeze_midway)
        )
        print("finished", flush=True)

    anyio.run(main)
    """
)


def test_invariant_7_kill_9_mid_persist_keeps_previous_snapshot(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    for name in ("big-1", "big-2", "small"):
        (workspace / name).write_bytes(os.urandom(12 * 1024 * 1024 if name != "small" else 100))
    original = {name: (workspace / name).read_bytes() for name in ("big-1", "big-2", "small")}
    store_dir = tmp_path / "store"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(store_dir), str(workspace)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        persisted = child.stdout.readline().split()
        assert persisted[0] == "persisted"
        assert child.stdout.readline().startswith("midway")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    debris = [path for path in store_dir.rglob("*") if ".tmp-" in path.name]
    assert debris, "the kill landed while a pack was being written"

    async def check() -> None:
        store = ContentAddressedSnapshotStore(LocalObjectStore(store_dir), max_workers=1)
        scope = SnapshotScope("tenant", "session")
        try:
            latest = await store.latest(scope)
            assert latest is not None and latest.snapshot_id == persisted[1]
            target = tmp_path / "restored"
            await store.restore(scope, target)
            assert {name: (target / name).read_bytes() for name in original} == original
            report = await store.gc("tenant", Retention(keep_last=1), grace_s=0)
            assert report.abandoned_writes_removed == len(debris)
            await store.restore(scope, tmp_path / "after-gc")
        finally:
            await store.aclose()

    anyio.run(check)
    assert not [path for path in store_dir.rglob("*") if ".tmp-" in path.name]
