"""The `SnapshotStore` contract (design invariant 7 and issue 4), for every backend."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import pytest

from cairn.snapshots import (
    ContentAddressedSnapshotStore,
    Exclusions,
    InvalidSnapshotIdError,
    PersistRequest,
    RestoreIncompleteError,
    Retention,
    SnapshotId,
    SnapshotNotFoundError,
    SnapshotNotRestorableError,
    SnapshotScope,
    layout,
)
from cairn.snapshots.testing import build_fidelity_workspace, describe_tree

pytestmark = pytest.mark.anyio


def new_scope(tenant: str | None = None) -> SnapshotScope:
    return SnapshotScope(tenant or f"tenant-{secrets.token_hex(3)}", f"sess-{secrets.token_hex(4)}")


async def persist(store: ContentAddressedSnapshotStore, scope: SnapshotScope, workspace: Path, **kwargs: object):  # type: ignore[no-untyped-def]
    result = await store.persist(PersistRequest(scope=scope, workspace=workspace, manifest_digest="m1", **kwargs))  # type: ignore[arg-type]
    assert result is not None
    return result


async def test_round_trip_keeps_every_fidelity_rule(store: ContentAddressedSnapshotStore, tmp_path: Path) -> None:
    source = tmp_path / "source"
    build_fidelity_workspace(source, with_venv=True)
    os.utime(source / "empty", ns=(10**18, 10**18))
    scope = new_scope()
    result = await persist(store, scope, source)

    target = tmp_path / "target"
    restored = await store.restore(scope, target)

    assert restored.snapshot == result.snapshot
    assert describe_tree(target) == describe_tree(source)
    assert os.lstat(target / "empty").st_mtime_ns == 10**18
    assert os.readlink(target / ".venv" / "bin" / "python") == os.readlink(source / ".venv" / "bin" / "python")
    sparse = os.stat(target / "sparse.img")
    assert sparse.st_blocks * 512 < 1024 * 1024, "holes must stay holes"
    assert os.stat(target / "data.bin").st_ino == os.stat(target / "hardlink-to-data.bin").st_ino


async def test_unchanged_content_is_stored_once_per_session_and_per_tenant(
    store: ContentAddressedSnapshotStore, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "big").write_bytes(os.urandom(9 * 1024 * 1024))
    (workspace / "small").write_bytes(os.urandom(5000))
    scope = new_scope()
    first = await persist(store, scope, workspace)
    assert first.snapshot.new_bytes == 9 * 1024 * 1024 + 5000

    (workspace / "small").write_bytes(os.urandom(100))
    second = await persist(store, scope, workspace, stat_cache=first.stat_cache, parent_id=first.snapshot.snapshot_id)
    assert second.snapshot.new_bytes == 100
    assert second.snapshot.parent_id == first.snapshot.snapshot_id

    other_session = SnapshotScope(scope.tenant_id, "another-session")
    copy = tmp_path / "copy"
    shutil.copytree(workspace, copy)
    third = await persist(store, other_session, copy)
    assert third.snapshot.new_bytes == 0

    other_tenant = await persist(store, new_scope(), copy)
    assert other_tenant.snapshot.new_bytes == 9 * 1024 * 1024 + 100, "content is never shared across tenants"


async def test_snapshots_are_immutable_listed_and_older_ones_restorable(
    store: ContentAddressedSnapshotStore, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    scope = new_scope()
    (workspace / "f").write_text("one")
    first = await persist(store, scope, workspace)
    (workspace / "f").write_text("two")
    second = await persist(store, scope, workspace)

    listed = await store.list_snapshots(scope)
    assert [info.snapshot_id for info in listed] == [first.snapshot.snapshot_id, second.snapshot.snapshot_id]
    assert await store.latest(scope) == second.snapshot
    assert await store.get_snapshot(scope, SnapshotId(first.snapshot.snapshot_id)) == first.snapshot

    await store.restore(scope, workspace, snapshot_id=SnapshotId(first.snapshot.snapshot_id))
    assert (workspace / "f").read_text() == "one"
    await store.restore(scope, workspace)
    assert (workspace / "f").read_text() == "two"


async def test_nothing_to_restore_is_a_typed_error(store: ContentAddressedSnapshotStore, tmp_path: Path) -> None:
    scope = new_scope()
    assert not await store.restorable(scope)
    assert not await store.restorable(scope, SnapshotId("snap_missing"))
    with pytest.raises(SnapshotNotRestorableError):
        await store.restore(scope, tmp_path / "ws")
    with pytest.raises(SnapshotNotFoundError):
        await store.restore(scope, tmp_path / "ws", snapshot_id=SnapshotId("snap_missing"))


@pytest.mark.parametrize("bad_id", ["", ".", "..", "a/b", "../x", "a\\b", "x\0y", "é"])
async def test_snapshot_ids_must_be_single_path_segments(
    store: ContentAddressedSnapshotStore, bad_id: str
) -> None:
    with pytest.raises(InvalidSnapshotIdError):
        await store.get_snapshot(new_scope(), SnapshotId(bad_id))
    with pytest.raises(InvalidSnapshotIdError):
        SnapshotScope("tenant", bad_id)


def _corrupt(objects_key: str, store: ContentAddressedSnapshotStore, how: str) -> None:
    data = store.objects.get_bytes(objects_key)
    if how == "flip":
        data = data[:10] + bytes([data[10] ^ 0xFF]) + data[11:]
    elif how == "truncate":
        data = data[: len(data) // 2]
    store.objects.put_bytes(objects_key, data)


@pytest.mark.parametrize("damage", ["flip-pack", "truncate-pack", "delete-pack", "flip-tree", "truncate-tree"])
async def test_damaged_snapshot_gives_restore_incomplete_and_leaves_workspace_untouched(
    store: ContentAddressedSnapshotStore, tmp_path: Path, damage: str
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "a").write_bytes(os.urandom(20_000))
    (source / "b").write_bytes(os.urandom(20_000))
    scope = new_scope()
    result = await persist(store, scope, source)
    pack = layout.pack_key(scope.tenant_id, result.snapshot.packs[0])
    tree = layout.tree_key(scope, result.snapshot.snapshot_id)
    if damage == "delete-pack":
        store.objects.delete(pack)
    else:
        how, _, what = damage.partition("-")
        _corrupt(pack if what == "pack" else tree, store, how)

    workspace = tmp_path / "live"
    workspace.mkdir()
    (workspace / "precious").write_text("keep me")
    (workspace / "a").write_text("live version")
    before = describe_tree(workspace)
    with pytest.raises(RestoreIncompleteError) as caught:
        await store.restore(scope, workspace)
    assert caught.value.code == "restore_incomplete"
    assert describe_tree(workspace) == before
    assert not [name for name in os.listdir(tmp_path) if ".cairn-" in name], "no staging or trash is left behind"


async def test_exclusions_are_not_persisted_and_survive_a_restore(
    store: ContentAddressedSnapshotStore, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    (workspace / "cache").mkdir(parents=True)
    (workspace / "cache" / "junk").write_text("ephemeral")
    (workspace / "mnt" / "data").mkdir(parents=True)
    (workspace / "mnt" / "data" / "mounted").write_text("not ours")
    (workspace / "mnt" / "own").write_text("ours")
    exclusions = Exclusions(ephemeral=["cache"], mounts=["/workspace/mnt/data"])
    scope = new_scope()
    result = await persist(store, scope, workspace, exclusions=exclusions)
    assert result.snapshot.file_count == 1

    (workspace / "mnt" / "own").write_text("changed")
    (workspace / "mnt" / "data" / "mounted").write_text("mount changed meanwhile")
    (workspace / "new").write_text("to be cleared")
    await store.restore(scope, workspace, exclusions=exclusions)
    assert sorted(os.listdir(workspace)) == ["cache", "mnt"]
    assert (workspace / "cache" / "junk").read_text() == "ephemeral"
    assert (workspace / "mnt" / "data" / "mounted").read_text() == "mount changed meanwhile"
    assert (workspace / "mnt" / "own").read_text() == "ours"


async def test_gc_applies_retention_and_never_deletes_referenced_content(
    store: ContentAddressedSnapshotStore, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "shared").write_bytes(os.urandom(50_000))
    scope = new_scope()
    ids = []
    for round_number in range(4):
        (workspace / "changing").write_bytes(os.urandom(10_000 + round_number))
        ids.append((await persist(store, scope, workspace)).snapshot.snapshot_id)

    report = await store.gc(scope.tenant_id, Retention(keep_last=2), grace_s=0)
    assert report.snapshots_deleted == 2
    # Round 0's pack also holds 'shared', which kept snapshots reference: only round 1's goes.
    assert report.packs_deleted == 1
    assert [info.snapshot_id for info in await store.list_snapshots(scope)] == ids[2:]
    for snapshot_id in ids[2:]:
        target = tmp_path / f"restore-{snapshot_id}"
        await store.restore(scope, target, snapshot_id=SnapshotId(snapshot_id))
        assert (target / "shared").read_bytes() == (workspace / "shared").read_bytes()

    again = await store.gc(scope.tenant_id, Retention(keep_last=2), grace_s=0)
    assert (again.snapshots_deleted, again.packs_deleted) == (0, 0)


async def test_gc_condemns_first_and_deletes_only_after_the_grace_period(
    store: ContentAddressedSnapshotStore, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    scope = new_scope()
    (workspace / "f").write_bytes(os.urandom(1000))
    await persist(store, scope, workspace)
    (workspace / "f").write_bytes(os.urandom(1000))
    await persist(store, scope, workspace)

    young = await store.gc(scope.tenant_id, Retention(keep_last=1), grace_s=3600)
    assert (young.snapshots_deleted, young.packs_condemned, young.packs_deleted) == (1, 0, 0)
    assert len(list(store.objects.list(layout.packs_prefix(scope.tenant_id)))) == 2


async def test_many_small_files_round_trip_and_are_stored_once(
    store: ContentAddressedSnapshotStore, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    for index in range(150):
        (workspace / f"f{index:03d}").write_bytes(os.urandom(100 + index))
    (workspace / "duplicate-a").write_bytes(b"same" * 100)
    (workspace / "duplicate-b").write_bytes(b"same" * 100)
    scope = new_scope()
    result = await persist(store, scope, workspace)
    assert result.snapshot.new_bytes <= sum(100 + index for index in range(150)) + 2 * 400
    target = tmp_path / "target"
    await store.restore(scope, target)
    assert describe_tree(target) == describe_tree(workspace)
    again = await persist(store, new_scope(scope.tenant_id), workspace)
    assert again.snapshot.new_bytes == 0


async def test_forgetting_a_deleted_session_removes_its_snapshots_and_gc_frees_its_content(
    store: ContentAddressedSnapshotStore, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    gone, kept = new_scope(), new_scope()
    kept = type(kept)(gone.tenant_id, kept.session_id)
    (workspace / "only-gone").write_bytes(os.urandom(20_000))
    await persist(store, gone, workspace)
    await persist(store, gone, workspace)
    (workspace / "only-gone").unlink()
    (workspace / "kept").write_bytes(os.urandom(20_000))
    await persist(store, kept, workspace)

    assert await store.forget(gone) == 2
    assert await store.list_snapshots(gone) == []
    assert not await store.restorable(gone)
    report = await store.gc(gone.tenant_id, Retention(keep_last=1), grace_s=0)
    assert report.packs_deleted >= 1
    target = tmp_path / "restored"
    await store.restore(kept, target)
    assert (target / "kept").read_bytes() == (workspace / "kept").read_bytes()
