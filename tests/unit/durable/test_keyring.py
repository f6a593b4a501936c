"""The local keyring: the key file made once (0600) or keys from CAIRN_MASTER_KEY, versions
added and dropped by a rotation, and other processes following the file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cairn.config import Settings
from cairn.durable import keyring as keyring_module
from cairn.durable.crypto import Envelope, SealScope
from cairn.durable.keyring import LocalKeyring, parse_keys
from cairn.errors import CairnMisuseError, InvalidRequestError, StateDeserializeError

pytestmark = pytest.mark.anyio

SCOPE = SealScope(tenant="t1", kind="credential", record_id="cred_1")
KEY_A = "a1" * 32
KEY_B = "b2" * 32


def test_the_key_file_is_made_on_first_start_owner_only_and_read_as_it_is_afterwards(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    first = LocalKeyring.from_settings(settings)
    path = settings.master_key_path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert first.versions() == [1] and first.is_file and first.source == str(path)
    before = path.read_text()
    again = LocalKeyring.from_settings(settings)
    assert path.read_text() == before and again.versions() == [1]
    assert again.current_version() == first.current_version()


async def test_a_second_process_reads_the_key_the_first_one_made(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    sealed = await Envelope(LocalKeyring.from_settings(settings)).seal(b"state", SCOPE)
    assert await Envelope(LocalKeyring.from_settings(settings)).open(sealed.blob, sealed.data_key.key, SCOPE) == b"state"


async def test_keys_from_the_environment_win_over_the_file_and_make_no_file(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, master_key=f"2:{KEY_B}, 1:{KEY_A}")
    keys = LocalKeyring.from_settings(settings)
    assert keys.versions() == [1, 2] and keys.current_version() == 2 and not keys.is_file
    assert not settings.master_key_path.exists()
    assert LocalKeyring.from_settings(Settings(data_dir=tmp_path, master_key=KEY_A)).versions() == [1]
    with pytest.raises(CairnMisuseError):
        keys.add_version()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "holds no master key"),
        ("abcd", "32 bytes"),
        ("zz" * 32, "hex digits"),
        (f"x:{KEY_A}", "whole number"),
        (f"0:{KEY_A}", "whole number"),
        (f"1:{KEY_A},1:{KEY_B}", "given twice"),
    ],
)
def test_a_bad_master_key_setting_is_refused_without_showing_the_key(value: str, problem: str) -> None:
    with pytest.raises(InvalidRequestError, match=problem) as caught:
        parse_keys(value, source="CAIRN_MASTER_KEY")
    assert KEY_A not in caught.value.message and KEY_B not in caught.value.message and caught.value.param == "CAIRN_MASTER_KEY"


async def test_a_rotation_adds_a_version_that_seals_and_dropping_the_old_one_keeps_only_it(tmp_path: Path) -> None:
    keys = LocalKeyring.from_settings(Settings(data_dir=tmp_path))
    envelope = Envelope(keys)
    old = await envelope.seal(b"before", SCOPE)
    assert keys.add_version() == 2 and keys.versions() == [1, 2]
    new = await envelope.seal(b"after", SCOPE)
    assert (old.data_key.key.version, new.data_key.key.version) == (1, 2)
    assert await envelope.open(old.blob, old.data_key.key, SCOPE) == b"before"  # the old version still opens
    assert keys.drop_versions_below(2) == [1] and keys.versions() == [2]
    assert stat.S_IMODE((tmp_path / "master.key").stat().st_mode) == 0o600
    with pytest.raises(StateDeserializeError, match="version 1 is not in the keyring"):
        await envelope.open(old.blob, old.data_key.key, SCOPE)
    assert keys.drop_versions_below(2) == []


async def test_another_process_on_the_data_dir_follows_a_rotation_without_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(data_dir=tmp_path)
    rotating, other = LocalKeyring.from_settings(settings), LocalKeyring.from_settings(settings)
    rotating.add_version()
    sealed = await Envelope(rotating).seal(b"under version 2", SCOPE)
    # Asked for a version it does not hold, it reads the file again at once.
    assert await Envelope(other).open(sealed.blob, sealed.data_key.key, SCOPE) == b"under version 2"
    assert other.versions() == [1, 2]
    third = LocalKeyring.from_settings(settings)
    rotating.add_version()
    monkeypatch.setattr(keyring_module, "RELOAD_INTERVAL_S", 0.0)
    # Before wrapping, it looks whether the file changed (at most once per interval).
    assert (await Envelope(third).seal(b"x", SCOPE)).data_key.key.version == 3


def test_the_file_is_refused_when_it_is_not_a_keyring(tmp_path: Path) -> None:
    (tmp_path / "master.key").write_text(f"1 {KEY_A}\n1 {KEY_B}\n")
    os.chmod(tmp_path / "master.key", 0o600)
    with pytest.raises(InvalidRequestError, match="given twice"):
        LocalKeyring.from_settings(Settings(data_dir=tmp_path))
