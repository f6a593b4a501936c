"""`cairn secrets status|rotate-master` on a real data dir: the key file rotated with every
data key re-wrapped and the old version dropped, keys from the environment rotated to their
highest version, and a keyring that does not open the database's keys refused untouched."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from cairn.cli import main
from cairn.config import Settings
from cairn.durable.crypto import SealScope
from cairn.durable.keyring import LocalKeyring, format_keys
from cairn.durable.sealing import Sealer
from cairn.store.db import Database

KEY_1, KEY_2 = os.urandom(32), os.urandom(32)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "data"
    assert main(["db", "upgrade", "--data-dir", str(directory)]) == 0
    return directory


def seal(data_dir: Path, *plaintexts: bytes, master_key: str | None = None) -> list[bytes]:
    """Blobs sealed as a server on this data dir would seal them."""

    async def run() -> list[bytes]:
        settings = Settings(data_dir=data_dir, master_key=master_key)
        sealer = Sealer(LocalKeyring.from_settings(settings))
        db = Database(settings.resolved_database_url)
        try:
            async with db.write() as conn:
                return [await sealer.seal(conn, p, SealScope("t1", "approval", f"apr_{n}")) for n, p in enumerate(plaintexts)]
        finally:
            await db.dispose()

    return anyio.run(run)


def opened(data_dir: Path, blobs: list[bytes], keys: dict[int, bytes]) -> list[bytes]:
    async def run() -> list[bytes]:
        sealer = Sealer(LocalKeyring(keys))
        db = Database(Settings(data_dir=data_dir).resolved_database_url)
        try:
            async with db.read() as conn:
                return [await sealer.open(conn, b, SealScope("t1", "approval", f"apr_{n}")) for n, b in enumerate(blobs)]
        finally:
            await db.dispose()

    return anyio.run(run)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    code = main(["secrets", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err


def test_rotating_the_key_file_rewraps_every_data_key_and_drops_the_old_version(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blobs = seal(data_dir, b"first", b"second", b"third")
    code, status, _ = run(capsys, "status", "--data-dir", str(data_dir))
    assert code == 0 and status["versions"] == [1] and status["data_keys_by_version"] == {"1": 3}
    old_keys = LocalKeyring.from_settings(Settings(data_dir=data_dir))
    code, report, err = run(capsys, "rotate-master", "--data-dir", str(data_dir), "--settle-s", "0")
    assert code == 0, err
    assert report["previous_versions"] == [1] and report["version"] == 2 and report["rewrapped"] == 3
    assert report["dropped_versions"] == [1] and report["unreadable"] == [] and report["data_keys_by_version"] == {"2": 3}
    text = (data_dir / "master.key").read_text()
    assert text.count("\n2 ") == 1 and "\n1 " not in text
    new_keys = LocalKeyring.from_settings(Settings(data_dir=data_dir))
    assert new_keys.versions() == [2] and old_keys.versions() == [1]
    assert opened(data_dir, blobs, {2: bytes.fromhex(text.split("\n2 ")[1].split()[0])}) == [b"first", b"second", b"third"]


def test_keys_from_the_environment_are_rotated_to_their_highest_version(
    data_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    blobs = seal(data_dir, b"sealed under 1", master_key=KEY_1.hex())
    monkeypatch.setenv("CAIRN_MASTER_KEY", f"2:{KEY_2.hex()},1:{KEY_1.hex()}")
    code, report, err = run(capsys, "rotate-master", "--data-dir", str(data_dir))
    assert code == 0 and report["version"] == 2 and report["rewrapped"] == 1 and report["dropped_versions"] == []
    assert report["unused_versions"] == [1] and "remove them from CAIRN_MASTER_KEY" in err
    assert not (data_dir / "master.key").exists()
    assert opened(data_dir, blobs, {2: KEY_2}) == [b"sealed under 1"]


def test_a_keyring_that_does_not_open_the_databases_keys_is_refused_and_nothing_changes(
    data_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    blobs = seal(data_dir, b"state", master_key=KEY_1.hex())
    monkeypatch.setenv("CAIRN_MASTER_KEY", KEY_2.hex())
    code, _, err = run(capsys, "rotate-master", "--data-dir", str(data_dir))
    assert code == 2 and "do not open the data keys" in err
    monkeypatch.delenv("CAIRN_MASTER_KEY")
    code, _, err = run(capsys, "rotate-master", "--data-dir", str(data_dir))
    assert code == 2 and "no master key" in err and not (data_dir / "master.key").exists()
    (data_dir / "master.key").write_text(format_keys({1: KEY_2}))
    code, _, err = run(capsys, "rotate-master", "--data-dir", str(data_dir), "--settle-s", "0")
    assert code == 2 and "do not open the data keys" in err
    assert LocalKeyring.from_settings(Settings(data_dir=data_dir)).versions() == [1]  # no version was added
    assert opened(data_dir, blobs, {1: KEY_1}) == [b"state"]
