"""`cairn snapshots list|show|restore|gc` through argparse, as the top-level CLI wires it."""

from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path

import anyio
import pytest

from cairn.snapshots import (
    InvalidSnapshotIdError,
    PersistRequest,
    SnapshotScope,
    SnapshotStoreConfig,
    add_snapshot_commands,
    open_snapshot_store,
)
from cairn.snapshots.progress import ProgressBar


def run(store_dir: Path, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="cairn")
    commands = parser.add_subparsers(dest="command", required=True)
    add_snapshot_commands(commands, open_store=lambda args: open_snapshot_store(SnapshotStoreConfig(local_root=store_dir)))
    args = parser.parse_args(list(argv))
    args.stdout, args.stderr = io.StringIO(), io.StringIO()
    code: int = anyio.run(args.run, args)
    return code, args.stdout.getvalue(), args.stderr.getvalue()


@pytest.fixture
def snapshot_ids(tmp_path: Path) -> list[str]:
    workspace = tmp_path / "ws"
    workspace.mkdir()

    async def make() -> list[str]:
        store = open_snapshot_store(SnapshotStoreConfig(local_root=tmp_path / "store"))
        ids = []
        for version in ("one", "two", "three"):
            (workspace / "file").write_text(version)
            (workspace / "blob").write_bytes(os.urandom(2000))
            request = PersistRequest(scope=SnapshotScope("acme", "sess"), workspace=workspace, manifest_digest="m")
            result = await store.persist(request)
            assert result is not None
            ids.append(result.snapshot.snapshot_id)
        await store.aclose()
        return ids

    return anyio.run(make)


def test_list_and_show(tmp_path: Path, snapshot_ids: list[str]) -> None:
    code, out, _ = run(tmp_path / "store", "snapshots", "list", "--tenant", "acme", "sess")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()[1:]] == snapshot_ids
    code, out, _ = run(tmp_path / "store", "snapshots", "list", "--tenant", "acme", "sess", "--json")
    assert [json.loads(line)["snapshot_id"] for line in out.splitlines()] == snapshot_ids
    code, out, _ = run(tmp_path / "store", "snapshots", "show", "--tenant", "acme", "sess", snapshot_ids[0])
    shown = json.loads(out)
    assert (shown["snapshot_id"], shown["file_count"], shown["pack_count"]) == (snapshot_ids[0], 2, 1)
    _, _, err = run(tmp_path / "store", "snapshots", "list", "--tenant", "acme", "nobody")
    assert "no snapshots" in err
    with pytest.raises(InvalidSnapshotIdError):
        run(tmp_path / "store", "snapshots", "show", "--tenant", "acme", "sess", "../etc")


def test_restore_with_progress_then_gc(tmp_path: Path, snapshot_ids: list[str]) -> None:
    target = tmp_path / "restored"
    code, out, err = run(
        tmp_path / "store", "snapshots", "restore", "--tenant", "acme", "sess", snapshot_ids[0], "--workspace", str(target)
    )
    assert code == 0 and snapshot_ids[0] in out
    assert "restore [" in err and "100%" in err
    assert (target / "file").read_text() == "one"

    code, out, _ = run(tmp_path / "store", "snapshots", "gc", "--tenant", "acme", "--keep-last", "1", "--grace-s", "0")
    assert "snapshots deleted: 2" in out
    assert "packs condemned: 2" in out and "deleted: 2" in out
    _, listed, _ = run(tmp_path / "store", "snapshots", "list", "--tenant", "acme", "sess", "--json")
    assert [json.loads(line)["snapshot_id"] for line in listed.splitlines()] == snapshot_ids[2:]


def test_progress_bar_redraws_only_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    bar = ProgressBar(terminal, "persist")
    bar(512 * 1024, 1024 * 1024)
    bar.finish()
    assert terminal.getvalue().startswith("\rpersist [###############...............]  50%")
    log = io.StringIO()
    quiet = ProgressBar(log, "persist")
    quiet(1, 2)
    quiet.finish()
    assert log.getvalue().count("\n") == 1 and "\r" not in log.getvalue()
