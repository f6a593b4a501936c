"""`WorkspaceLifecycle`: the three start branches, stop = persist only, failure rollback."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
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
from cairn.snapshots import lifecycle as lifecycle_module
from cairn.snapshots.objects import ObjectWriter
from cairn.snapshots.stat_cache import StatCache
from cairn.snapshots.testing import describe_tree
from tests.unit.snapshots.settling import is_settled
from tests.unit.snapshots.test_stat_listing import CHANGES as LISTING_CHANGES
from tests.waits import until

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
    def open_writer(self, key: str, *, size_hint: int | None = None) -> ObjectWriter:
        if key.endswith(".json"):
            raise OSError(28, "No space left on device")
        return super().open_writer(key, size_hint=size_hint)


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


# The skip check from a stat walk (`stat_listing`): taken only when it is sound.


def saved_header(cycle: WorkspaceLifecycle) -> dict[str, object]:
    header: dict[str, object] = json.loads(cycle.state_path.read_bytes().partition(b"\n")[0])
    return header


async def settle(workspace: Path) -> None:
    await until(lambda: is_settled(workspace), "the workspace to leave the racy window")


async def persisted_and_settled(store: ContentAddressedSnapshotStore, tmp_path: Path) -> WorkspaceLifecycle:
    """A persisted workspace whose state file carries a stat listing (the fast path is armed)."""
    first = lifecycle(store, tmp_path)
    await first.start()
    workspace = tmp_path / "ws"
    (workspace / "dir").mkdir()
    (workspace / "dir" / "file").write_text("content")
    (workspace / "other").write_text("other")
    os.symlink("dir/file", workspace / "link")
    await first.stop()
    await first.shutdown()
    assert saved_header(first)["stat_listing"] is None, "files written just now are racy"
    await settle(tmp_path / "ws")
    settling = lifecycle(store, tmp_path)
    assert (await settling.start()).outcome is StartOutcome.REUSED
    await settling.shutdown()
    assert isinstance(saved_header(settling)["stat_listing"], str)
    return settling


def forbid_full_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> None:
        pytest.fail("the full fingerprint path was taken")

    monkeypatch.setattr("cairn.snapshots.lifecycle.fingerprint_workspace", fail)


async def test_a_settled_workspace_is_reused_from_a_stat_walk_alone(
    store: ContentAddressedSnapshotStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await persisted_and_settled(store, tmp_path)
    with monkeypatch.context() as patched:
        forbid_full_fingerprint(patched)
        patched.setattr(StatCache, "from_json", lambda data: pytest.fail("decoded the stat cache"))
        check = lifecycle(store, tmp_path)
        reused = await check.start()
    assert reused.outcome is StartOutcome.REUSED
    # The stat cache is decoded when the persist needs it.
    (tmp_path / "ws" / "other").write_text("changed")
    stopped = await check.stop()
    assert stopped.snapshot is not None and stopped.snapshot.new_bytes == len("changed")


# The fixture of the stat listing's tests has the same layout (dir/file, other, link).
WORKSPACE_CHANGES = {
    name: LISTING_CHANGES[name]
    for name in ("content, same size and mtime", "chmod", "rename", "empty dir added", "symlink retargeted")
}


@pytest.mark.parametrize("change", WORKSPACE_CHANGES.values(), ids=WORKSPACE_CHANGES.keys())
async def test_any_change_forces_a_restore_although_the_stat_walk_is_armed(
    store: ContentAddressedSnapshotStore, tmp_path: Path, change: Callable[[Path], object]
) -> None:
    settled_cycle = await persisted_and_settled(store, tmp_path)
    before = describe_tree(tmp_path / "ws")
    change(tmp_path / "ws")
    await settle(tmp_path / "ws")  # even a change that has settled is seen
    check = lifecycle(store, tmp_path)
    assert (await check.start()).outcome is StartOutcome.RESTORED
    assert describe_tree(tmp_path / "ws") == before
    assert saved_header(check)["snapshot_id"] == saved_header(settled_cycle)["snapshot_id"]


async def test_an_armed_stat_walk_never_reuses_for_a_newer_snapshot(
    store: ContentAddressedSnapshotStore, tmp_path: Path
) -> None:
    await persisted_and_settled(store, tmp_path)
    # Another machine persists the same session from a different tree: the workspace here is
    # unchanged, so its listing matches the state file, but it is not the latest snapshot.
    elsewhere = WorkspaceLifecycle(store=store, scope=SCOPE, workspace=tmp_path / "elsewhere", manifest_digest="manifest-1")
    await elsewhere.start()
    (tmp_path / "elsewhere" / "other").write_text("newer")
    newer = (await elsewhere.stop()).snapshot
    check = lifecycle(store, tmp_path)
    restored = await check.start()
    assert (restored.outcome, restored.snapshot) == (StartOutcome.RESTORED, newer)
    assert (tmp_path / "ws" / "other").read_text() == "newer"


async def test_a_racy_listing_is_never_trusted(
    store: ContentAddressedSnapshotStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await persisted_and_settled(store, tmp_path)
    cycle = lifecycle(store, tmp_path)
    await cycle.start()
    (tmp_path / "ws" / "other").write_text("edited right before the stop")
    await cycle.stop()
    await cycle.shutdown()
    assert saved_header(cycle)["stat_listing"] is None
    full_checks: list[Path] = []
    real = lifecycle_module.fingerprint_workspace

    def counting(workspace: Path, *args: object) -> object:
        full_checks.append(workspace)
        return real(workspace, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(lifecycle_module, "fingerprint_workspace", counting)
    assert (await lifecycle(store, tmp_path).start()).outcome is StartOutcome.REUSED
    assert full_checks == [tmp_path / "ws"]


async def test_the_previous_releases_state_file_costs_one_re_hash_and_is_replaced(
    store: ContentAddressedSnapshotStore, tmp_path: Path
) -> None:
    settled_cycle = await persisted_and_settled(store, tmp_path)
    header = saved_header(settled_cycle)
    stat_cache = json.loads(settled_cycle.state_path.read_bytes().partition(b"\n")[2])
    old = {key: value for key, value in header.items() if key != "stat_listing"}
    # Format 1, as the release before format 2 wrote it: one document, fingerprint v1.
    previous = {**old, "format": 1, "fingerprint_version": "cairn-tree-sha256-v1", "stat_cache": stat_cache}
    settled_cycle.state_path.write_text(json.dumps(previous))
    assert (await lifecycle(store, tmp_path).start()).outcome is StartOutcome.REUSED
    assert saved_header(settled_cycle)["format"] == 2
    assert saved_header(settled_cycle)["fingerprint_version"] == header["fingerprint_version"]


BROKEN_STATE_FILES = {
    "not json": b"\x00\xff not json",
    "a json list": b"[]",
    "a header without fields": b'{"format":2}',
    "a listing that is no string": None,
    "a malformed stat cache": None,
}


@pytest.mark.parametrize("broken", BROKEN_STATE_FILES.keys())
async def test_a_broken_state_file_never_fails_a_start_or_stop(
    store: ContentAddressedSnapshotStore, tmp_path: Path, broken: str
) -> None:
    settled_cycle = await persisted_and_settled(store, tmp_path)
    header_line, _, cache_line = settled_cycle.state_path.read_bytes().partition(b"\n")
    contents = BROKEN_STATE_FILES[broken]
    if broken == "a listing that is no string":
        contents = json.dumps({**json.loads(header_line), "stat_listing": 7}).encode() + b"\n" + cache_line
    elif broken == "a malformed stat cache":
        contents = header_line + b'\n{"dir/file": [1, 2]}'
    assert contents is not None
    settled_cycle.state_path.write_bytes(contents)
    cycle = lifecycle(store, tmp_path)
    assert (await cycle.start()).outcome is StartOutcome.REUSED
    (tmp_path / "ws" / "other").write_text("changed")
    stopped = await cycle.stop()
    assert stopped.snapshot is not None
    assert (await lifecycle(store, tmp_path).start()).outcome is StartOutcome.REUSED
