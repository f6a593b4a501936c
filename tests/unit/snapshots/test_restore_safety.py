"""A tree that tries to escape the workspace is refused before anything is written."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cairn.snapshots import (
    ContentAddressedSnapshotStore,
    LocalObjectStore,
    RestoreIncompleteError,
    SnapshotScope,
    layout,
)
from cairn.snapshots.models import RootMeta, SnapshotInfo, TreeEntry
from cairn.snapshots.persist import encode_tree_entry

pytestmark = pytest.mark.anyio

SCOPE = SnapshotScope("tenant", "session")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ContentAddressedSnapshotStore]:
    snapshot_store = ContentAddressedSnapshotStore(LocalObjectStore(tmp_path / "store"), max_workers=1)
    yield snapshot_store
    await snapshot_store.aclose()


def plant(store: ContentAddressedSnapshotStore, entries: list[dict[str, Any]]) -> None:
    """Write a well-formed (digest-correct) snapshot whose entries are hostile."""
    base = {"mode": 0o644, "uid": 0, "gid": 0, "mtime_ns": 0}
    tree = b"".join(encode_tree_entry(TreeEntry.model_validate({**base, **entry})) for entry in entries)
    store.objects.put_bytes(layout.tree_key(SCOPE, "snap_evil"), tree)
    info = SnapshotInfo(
        snapshot_id="snap_evil",
        tenant_id=SCOPE.tenant_id,
        session_id=SCOPE.session_id,
        created_at=datetime.now(UTC),
        parent_id=None,
        fingerprint="f",
        fingerprint_version="v",
        manifest_digest="m",
        tree_sha256=hashlib.sha256(tree).hexdigest(),
        tree_bytes=len(tree),
        root=RootMeta(mode=0o755, uid=0, gid=0, mtime_ns=0),
        entry_count=len(entries),
        file_count=0,
        total_bytes=0,
        new_bytes=0,
        packs=(),
    )
    store.objects.put_bytes(layout.header_key(SCOPE, "snap_evil"), info.model_dump_json().encode())


@pytest.mark.parametrize(
    "entries",
    [
        [{"path": "../escape", "kind": "file"}],
        [{"path": "/etc/evil", "kind": "file"}],
        [{"path": "a/../../escape", "kind": "file"}],
        [{"path": "missing-parent/file", "kind": "file"}],
        # A symlink used as a directory would redirect the write outside the workspace.
        [{"path": "link", "kind": "symlink", "target": ".."}, {"path": "link/escape", "kind": "file"}],
        [{"path": "hard", "kind": "hardlink", "target": "/etc/passwd"}],
        [{"path": "hard", "kind": "hardlink", "target": "../outside"}],
        [{"path": "dup", "kind": "dir"}, {"path": "dup", "kind": "file"}],
        [{"path": "big", "kind": "file", "size": 10}],
    ],
)
async def test_hostile_trees_are_refused_and_nothing_is_written(
    store: ContentAddressedSnapshotStore, tmp_path: Path, entries: list[dict[str, Any]]
) -> None:
    plant(store, entries)
    workspace = tmp_path / "area" / "ws"
    workspace.mkdir(parents=True)
    (workspace / "existing").write_text("unchanged")
    with pytest.raises(RestoreIncompleteError):
        await store.restore(SCOPE, workspace)
    assert sorted(os.listdir(tmp_path / "area")) == ["ws"]
    assert os.listdir(workspace) == ["existing"]


async def test_symlinks_pointing_outside_are_restored_as_links_never_followed(
    store: ContentAddressedSnapshotStore, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    plant(store, [{"path": "out", "kind": "symlink", "target": str(outside)}, {"path": "dir", "kind": "dir"}])
    workspace = tmp_path / "ws"
    await store.restore(SCOPE, workspace)
    assert os.readlink(workspace / "out") == str(outside)
    assert os.listdir(outside) == []
