"""`WorkspaceLifecycle`: the three start branches, stop = persist only, failure rollback."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cairn.snapshots import (
    ContentAddressedSnapshotStore,
    Exclusions,
    LifecycleState,
    LifecycleStateError,
    LocalObjectStore,
    NoopSnapshotStore,
    PersistFailedError,
    SnapshotId,
    SnapshotNotRestorableError,
    SnapshotScope,
    StartOutcome,
    WorkspaceLifecycle,
)
from cairn.snapshots import fingerprint as fingerprint_module
from cairn.snapshots.objects import ObjectWriter
from cairn.snapshots.testing import describe_tree

pytestmark = pytest.mark.anyio

SCOPE = SnapshotScope("tenant", "session-1")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ContentAddressedSnapshotStore]:
    snapshot_store = ContentAddressedSnapshotStore(LocalObjectStore(tmp_path / "store"), max_workers=2)
    yield snapshot_store
    await snapshot_store.aclose()


def lifecycle(store: object, tmp_path: Path, manifest_digest: str = "manifest-1", **kwargs: object) -> WorkspaceLifecycle:
    return WorkspaceLifecycle(
        store=store,  # type: ignore[arg-type]
        scope=SCOPE,
        workspace=tmp_path / "ws",
        manifest_digest=manifest_digest,
        **kwargs,  # type: ignore[arg-type]
    )


async def test_fresh_then_reuse_then_restore(store: ContentAddressedSnapshotStore, tmp_path: Path) -> None:
    materialised: list[Path] = []

    async def materialise(workspace: Path) -> None:
        materialised.append(workspace)
        (workspace / "README").write_text("seeded")

    first = lifecycle(store, tmp_path, materialise=materialise)
    started = await first.start()
    assert (started.outcome, started.snapshot) == (StartOutcome.FRESH, None)
    assert materialised == [tmp_path / "ws"]
    stopped = await first.stop()
    assert stopped.snapshot is not None
    await first.shutdown()

    second = lifecycle(store, tmp_path, materialise=materialise)
    reused = await second.start()
    assert reused.outcome is StartOutcome.REUSED
    assert reused.snapshot == stopped.snapshot
    (tmp_path / "ws" / "README").write_text("edited after the snapshot")
    await second.shutdown()

    third = lifecycle(store, tmp_path)
    restored = await third.start()
    assert restored.outcome is StartOutcome.RESTORED
    assert (tmp_path / "ws" / "README").read_text() == "seeded"
    assert len(materialised) == 1


async def test_workspace_deleted_between_turns_is_restored(store: ContentAddressedSnapshotStore, tmp_path: Path) -> None:
    first = lifecycle(store, tmp_path)
    await first.start()
    (tmp_path / "ws" / "file").write_text("x")
    await first.stop()
    await first.shutdown()
    (tmp_path / "ws" / "file").unlink()
    (tmp_path / "ws").rmdir()

    second = lifecycle(store, tmp_path)
    assert (await second.start()).outcome is StartOutcome.RESTORED
    assert (tmp_path / "ws" / "file").read_text() == "x"


async def test_manifest_change_forces_a_restore(store: ContentAddressedSnapshotStore, tmp_path: Path) -> None:
    first = lifecycle(store, tmp_path, manifest_digest="manifest-1")
    await first.start()
    (tmp_path / "ws" / "file").write_text("x")
    await first.stop()

    same = lifecycle(store, tmp_path, manifest_digest="manifest-1")
    assert (await same.start()).outcome is StartOutcome.REUSED
    changed = lifecycle(store, tmp_path, manifest_digest="manifest-2")
    assert (await changed.start()).outcome is StartOutcome.RESTORED


async def test_reuse_check_reads_no_unchanged_file(
    store: ContentAddressedSnapshotStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = lifecycle(store, tmp_path)
    await first.start()
    for index in range(20):
        (tmp_path / "ws" / f"f{index}").write_bytes(os.urandom(1000))
    past = 1_600_000_000 * 10**9
    for index in range(20):
        os.utime(tmp_path / "ws" / f"f{index}", ns=(past, past))
    # Every ctime is "now", so the persist-time cache is racy; one reuse check settles it.
    await first.stop()
    await first.shutdown()
    hashed: list[str] = []
    real_hash = fingerprint_module.hash_stored_content

    def counting_hash(path: str, entry: object) -> str:
        hashed.append(path)
        return real_hash(path, entry)  # type: ignore[arg-type]

    monkeypatch.setattr(fingerprint_module, "hash_stored_content", counting_hash)
    monkeypatch.setattr("cairn.snapshots.stat_cache.RACY_WINDOW_NS", 0)
    settle = lifecycle(store, tmp_path)
    assert (await settle.start()).outcome is StartOutcome.REUSED
    hashed.clear()

    check = lifecycle(store, tmp_path)
    assert (await check.start()).outcome is StartOutcome.REUSED
    assert hashed == []


async def test_explicit_older_snapshot_is_restored(store: ContentAddressedSnapshotStore, tmp_path: Path) -> None:
    first = lifecycle(store, tmp_path)
    await first.start()
    (tmp_path / "ws" / "file").write_text("v1")
    v1 = (await first.stop()).snapshot
    assert v1 is not None
    await first.start()
    (tmp_path / "ws" / "file").write_text("v2")
    await first.stop()

    again = lifecycle(store, tmp_path)
    result = await again.start(snapshot_id=SnapshotId(v1.snapshot_id))
    assert result.outcome is StartOutcome.RESTORED
    assert (tmp_path / "ws" / "file").read_text() == "v1"


class _FailingHeaderWrites(LocalObjectStore):
    def open_writer(self, key: str) -> ObjectWriter:
        if key.endswith(".json"):
            raise OSError(28, "No space left on device")
        return super().open_writer(key)


async def test_failed_persist_keeps_previous_snapshot_and_drops_cached_fingerprint(tmp_path: Path) -> None:
    objects = _FailingHeaderWrites(tmp_path / "store")
    good_store = ContentAddressedSnapshotStore(LocalObjectStore(tmp_path / "store"), max_workers=1)
    good = lifecycle(good_store, tmp_path)
    await good.start()
    (tmp_path / "ws" / "file").write_text("persisted")
    previous = (await good.stop()).snapshot
    assert previous is not None
    assert good.state_path.exists()
    await good.shutdown()
    await good_store.aclose()

    failing_store = ContentAddressedSnapshotStore(objects, max_workers=1)
    failing = lifecycle(failing_store, tmp_path)
    assert (await failing.start()).outcome is StartOutcome.REUSED
    (tmp_path / "ws" / "file").write_text("never persisted")
    with pytest.raises(PersistFailedError) as caught:
        await failing.stop()
    assert caught.value.code == "snapshot_persist_failed"
    assert not failing.state_path.exists(), "a failed persist drops the cached fingerprint"
    assert failing.state is LifecycleState.STARTED
    assert await failing_store.latest(SCOPE) == previous
    await failing_store.aclose()


async def test_verbs_out_of_order_are_misuse(store: ContentAddressedSnapshotStore, tmp_path: Path) -> None:
    cycle = lifecycle(store, tmp_path)
    with pytest.raises(LifecycleStateError):
        await cycle.stop()
    await cycle.start()
    with pytest.raises(LifecycleStateError):
        await cycle.start()
    await cycle.shutdown()
    await cycle.shutdown()
    with pytest.raises(LifecycleStateError):
        await cycle.start()


async def test_noop_store_persists_nothing_and_always_starts_fresh(tmp_path: Path) -> None:
    store = NoopSnapshotStore()
    assert not await store.restorable(SCOPE)
    with pytest.raises(SnapshotNotRestorableError):
        await store.restore(SCOPE, tmp_path / "ws")
    cycle = lifecycle(store, tmp_path)
    assert (await cycle.start()).outcome is StartOutcome.FRESH
    (tmp_path / "ws" / "kept").write_text("local only")
    stopped = await cycle.stop()
    assert stopped.snapshot is None
    assert not cycle.state_path.exists()
    assert (await cycle.start()).outcome is StartOutcome.FRESH
    assert (tmp_path / "ws" / "kept").read_text() == "local only", "fresh never wipes a workspace"


async def test_mount_registered_at_runtime_is_excluded_and_kept(
    store: ContentAddressedSnapshotStore, tmp_path: Path
) -> None:
    cycle = lifecycle(store, tmp_path, exclusions=Exclusions(ephemeral=["tmp"]))
    await cycle.start()
    cycle.exclusions.add_mount("/workspace/data")
    (tmp_path / "ws" / "data").mkdir()
    (tmp_path / "ws" / "data" / "big").write_text("mounted")
    (tmp_path / "ws" / "tmp").mkdir()
    (tmp_path / "ws" / "code").write_text("mine")
    snapshot = (await cycle.stop()).snapshot
    assert snapshot is not None and snapshot.file_count == 1

    (tmp_path / "ws" / "data" / "more").write_text("mount changed")
    (tmp_path / "ws" / "tmp" / "scratch").write_text("ephemeral")
    assert (await cycle.start()).outcome is StartOutcome.REUSED, "excluded paths never force a restore"
    before = describe_tree(tmp_path / "ws")
    (tmp_path / "ws" / "code").write_text("changed")
    await cycle.shutdown()
    again = lifecycle(store, tmp_path, exclusions=Exclusions(ephemeral=["tmp"], mounts=["data"]))
    assert (await again.start()).outcome is StartOutcome.RESTORED
    after = describe_tree(tmp_path / "ws")
    assert {path: item for path, item in after.items() if path != "code"} == {
        path: item for path, item in before.items() if path != "code"
    }
    assert (tmp_path / "ws" / "code").read_text() == "mine"


async def test_a_restored_workspace_is_reused_next_time(store: ContentAddressedSnapshotStore, tmp_path: Path) -> None:
    from cairn.snapshots.testing import build_fidelity_workspace

    first = lifecycle(store, tmp_path)
    await first.start()
    build_fidelity_workspace(tmp_path / "ws", sparse_size=8 * 1024 * 1024)
    await first.stop()
    await first.shutdown()
    os.rename(tmp_path / "ws", tmp_path / "gone")

    second = lifecycle(store, tmp_path)
    assert (await second.start()).outcome is StartOutcome.RESTORED
    await second.shutdown()
    third = lifecycle(store, tmp_path)
    assert (await third.start()).outcome is StartOutcome.REUSED
