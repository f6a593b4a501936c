"""The fan-out helper, and the persist/restore paths it schedules: large blobs, shared blobs, many directories."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cairn.snapshots import (
    ContentAddressedSnapshotStore,
    LocalObjectStore,
    PersistRequest,
    RestoreIncompleteError,
    SnapshotScope,
    layout,
)
from cairn.snapshots import persist as persist_module
from cairn.snapshots._parallel import run_tasks
from cairn.snapshots.packs import PackWriter

SCOPE = SnapshotScope("tenant", "session")
MIB = 1024 * 1024


def test_run_tasks_runs_every_task_once_with_per_thread_state() -> None:
    done: list[int] = []
    lock = threading.Lock()

    def work(task: int, state: list[int]) -> None:
        state.append(task)
        with lock:
            done.append(task)

    def new_state(_lane: int) -> list[int]:
        return []

    with ThreadPoolExecutor(2) as executor:
        states = run_tasks(executor, list(range(50)), work, new_state)
    assert sorted(done) == list(range(50))
    assert sorted(tasks for state in states for tasks in state) == list(range(50))


def test_run_tasks_stops_at_the_first_failure_and_waits_for_running_helpers() -> None:
    started: list[int] = []
    running = threading.Event()
    still_writing: list[bool] = []

    def work(task: int, _state: None) -> None:
        started.append(task)
        if task == 0:
            running.set()
            time.sleep(0.2)  # a helper still busy when the caller fails
            still_writing.append(False)
        elif task == 1:
            assert running.wait(10), "task 0 never started"
            raise ValueError("boom")

    with ThreadPoolExecutor(1) as executor, pytest.raises(ValueError, match="boom"):
        run_tasks(executor, list(range(100)), work, lambda _lane: None)
    assert still_writing == [False], "run_tasks returned before the helper let go of its task"
    assert len(started) < 100


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ContentAddressedSnapshotStore]:
    snapshot_store = ContentAddressedSnapshotStore(LocalObjectStore(tmp_path / "store"), max_workers=2)
    yield snapshot_store
    await snapshot_store.aclose()


def _build(workspace: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for index in range(150):  # several directories of more than one span's worth of files
        files[f"d{index % 3}/f{index:03d}"] = os.urandom(100 + index)
    files["big/a.bin"] = os.urandom(3 * MIB + 17)  # streamed in chunks on restore
    files["big/same-as-a.bin"] = files["big/a.bin"]  # one blob, two targets
    files["big/readonly.bin"] = os.urandom(2 * MIB)
    for path, data in files.items():
        (workspace / path).parent.mkdir(parents=True, exist_ok=True)
        (workspace / path).write_bytes(data)
    os.chmod(workspace / "big/readonly.bin", 0o444)
    os.utime(workspace / "big/a.bin", ns=(1_000_000_000, 1_000_000_000))
    return files


@pytest.mark.anyio
async def test_large_shared_and_many_small_files_round_trip(
    store: ContentAddressedSnapshotStore, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    files = _build(workspace)
    result = await store.persist(PersistRequest(scope=SCOPE, workspace=workspace, manifest_digest="m"))
    assert result is not None
    target = tmp_path / "restored" / "ws"
    await store.restore(SCOPE, target)
    for path, data in files.items():
        assert (target / path).read_bytes() == data, path
    assert os.stat(target / "big/readonly.bin").st_mode & 0o777 == 0o444
    assert os.stat(target / "big/a.bin").st_mtime_ns == 1_000_000_000
    assert not [name for name in os.listdir(target.parent) if name != "ws"], "staging/trash left behind"


@pytest.mark.anyio
async def test_a_corrupt_large_blob_leaves_the_workspace_untouched(
    store: ContentAddressedSnapshotStore, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    _build(workspace)
    result = await store.persist(PersistRequest(scope=SCOPE, workspace=workspace, manifest_digest="m"))
    assert result is not None
    # Flip one byte in the middle of the biggest pack (a large file's own pack).
    packs = sorted(store.objects.list(layout.packs_prefix(SCOPE.tenant_id)), key=lambda info: -info.size)
    pack_path = tmp_path / "store" / Path(*packs[0].key.split("/"))
    with open(pack_path, "r+b") as handle:
        handle.seek(MIB)
        byte = handle.read(1)
        handle.seek(MIB)
        handle.write(bytes([byte[0] ^ 0xFF]))
    target = tmp_path / "live"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(RestoreIncompleteError):
        await store.restore(SCOPE, target)
    assert sorted(os.listdir(target)) == ["keep.txt"]
    assert (target / "keep.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["live", "store", "ws"], "staging left behind"


@pytest.mark.anyio
async def test_packs_left_open_stay_bounded_however_many_files_need_one(
    store: ContentAddressedSnapshotStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the large-file limit lowered, each of 60 files streams into a pack of its own;
    # unbounded, all 60 would stay open (a file and its buffer, or unsent S3 bytes, each)
    # until the persist ends.
    monkeypatch.setattr(persist_module, "SMALL_FILE_LIMIT", 1024)
    open_now = peak = 0
    lock = threading.Lock()
    opened, committed, aborted = PackWriter.__init__, PackWriter.commit, PackWriter.abort

    def counting_init(self: PackWriter, *args: object, **kwargs: object) -> None:
        nonlocal open_now, peak
        opened(self, *args, **kwargs)  # type: ignore[arg-type]
        with lock:
            open_now += 1
            peak = max(peak, open_now)

    def closing(method):  # type: ignore[no-untyped-def]
        def wrapper(self: PackWriter) -> object:
            nonlocal open_now
            with lock:
                open_now -= 1
            return method(self)

        return wrapper

    monkeypatch.setattr(PackWriter, "__init__", counting_init)
    monkeypatch.setattr(PackWriter, "commit", closing(committed))
    monkeypatch.setattr(PackWriter, "abort", closing(aborted))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    files = {f"f{index:02d}": os.urandom(2048) for index in range(60)}
    for name, data in files.items():
        (workspace / name).write_bytes(data)
    result = await store.persist(PersistRequest(scope=SCOPE, workspace=workspace, manifest_digest="m"))
    assert result is not None and len(result.snapshot.packs) == 60
    threads = 1 + 2  # the calling thread and the store's two workers
    assert peak <= persist_module._MAX_FILLED_PACKS + threads, peak
    assert open_now == 0
    target = tmp_path / "restored" / "ws"
    await store.restore(SCOPE, target)
    for name, data in files.items():
        assert (target / name).read_bytes() == data, name
