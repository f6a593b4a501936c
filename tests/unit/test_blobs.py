"""The blob store's layout and the file primitives garbage collection is built on."""

from __future__ import annotations

import hashlib
import io
import os
import time
from pathlib import Path

import pytest

from cairn.blobs import CONDEMNED_PREFIX, INCOMING_PREFIX, BlobFile, BlobStore
from cairn.errors import BlobStoreError


@pytest.fixture
def blobs(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


def _put(blobs: BlobStore, content: bytes) -> str:
    sha256, size = blobs.put_stream(io.BytesIO(content))
    assert (sha256, size) == (hashlib.sha256(content).hexdigest(), len(content))
    return sha256


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_content_is_stored_once_under_its_digest_and_read_back_in_chunks(blobs: BlobStore) -> None:
    sha256 = _put(blobs, b"hello")
    assert _put(blobs, b"hello") == sha256
    assert blobs.path_of(sha256) == blobs.root / sha256[:2] / sha256[2:]
    assert b"".join(blobs.iter_chunks(sha256)) == b"hello"
    assert [p.name for p in blobs.root.iterdir() if p.is_file()] == []


def test_storing_content_again_makes_the_blob_young_again(blobs: BlobStore) -> None:
    sha256 = _put(blobs, b"again")
    _age(blobs.path_of(sha256), 7200)
    _put(blobs, b"again")
    assert time.time() - blobs.path_of(sha256).stat().st_mtime < 60


def test_bad_digests_and_failed_stores_are_typed_errors_and_leave_no_temporary_file(blobs: BlobStore) -> None:
    with pytest.raises(BlobStoreError):
        blobs.path_of("../../etc/passwd")

    class Broken(io.RawIOBase):
        def readinto(self, buffer: object) -> int:
            raise OSError("disk went away")

    with pytest.raises(BlobStoreError, match="disk went away"):
        blobs.put_stream(Broken())  # type: ignore[arg-type]
    assert list(blobs.root.iterdir()) == []


def test_the_clock_is_the_directory_s_and_leaves_nothing_behind(blobs: BlobStore) -> None:
    blobs.root.mkdir()
    assert abs(blobs.clock() - time.time()) < 5
    assert list(blobs.root.iterdir()) == []


def test_survey_and_scan_find_only_what_the_store_wrote(blobs: BlobStore) -> None:
    assert blobs.survey() is None
    sha256 = _put(blobs, b"one")
    (blobs.root / f"{INCOMING_PREFIX}abc").write_bytes(b"partial")
    (blobs.root / f"{CONDEMNED_PREFIX}{sha256}.1234").write_bytes(b"one")
    (blobs.root / f"{CONDEMNED_PREFIX}not-a-digest").write_bytes(b"x")
    (blobs.root / "zz").mkdir()
    (blobs.root / "README").write_text("an operator's note")
    prefix_dir = blobs.path_of(sha256).parent
    (prefix_dir / "stray.txt").write_text("not a blob")
    (prefix_dir / ("0" * 62)).symlink_to("/etc/passwd")

    survey = blobs.survey()
    assert survey is not None
    assert survey.prefixes == [sha256[:2]]
    assert [(f.name, f.size) for f in survey.incoming] == [(f"{INCOMING_PREFIX}abc", 7)]
    assert [(f.sha256, f.size) for f in survey.condemned] == [(sha256, 3)]
    assert blobs.scan_prefix(sha256[:2], time.time() + 60) == (1, {sha256: 3})
    assert blobs.scan_prefix(sha256[:2], time.time() - 60) == (1, {}), "stored since the cutoff"
    assert blobs.scan_prefix("ff", time.time()) == (0, {})


def test_condemn_moves_an_old_blob_aside_and_leaves_a_young_one(blobs: BlobStore) -> None:
    old, young = _put(blobs, b"old"), _put(blobs, b"young")
    _age(blobs.path_of(old), 7200)
    cutoff = time.time() - 3600

    aside = blobs.condemn(old, cutoff)
    assert aside is not None and aside.name.startswith(f"{CONDEMNED_PREFIX}{old}.") and aside.size == 3
    assert not blobs.path_of(old).exists()
    assert blobs.delete(aside) and not (blobs.root / aside.name).exists()
    assert not blobs.delete(aside), "a second delete finds nothing"

    assert blobs.condemn(young, cutoff) is None
    assert b"".join(blobs.iter_chunks(young)) == b"young"
    assert blobs.condemn("f" * 64, cutoff) is None, "nothing to move"
    assert sorted(p.name for p in blobs.root.iterdir() if p.is_file()) == []


def test_a_copy_stored_while_the_old_one_was_aside_survives_its_deletion(blobs: BlobStore) -> None:
    sha256 = _put(blobs, b"shared")
    _age(blobs.path_of(sha256), 7200)
    aside = blobs.condemn(sha256, time.time() - 3600)
    assert aside is not None
    _put(blobs, b"shared")  # a turn publishes the same content at this moment
    assert blobs.delete(aside)
    assert b"".join(blobs.iter_chunks(sha256)) == b"shared"


def test_a_young_leftover_goes_back_unless_a_newer_copy_was_stored(blobs: BlobStore) -> None:
    sha256 = _put(blobs, b"left")
    path = blobs.path_of(sha256)
    leftover = blobs.root / f"{CONDEMNED_PREFIX}{sha256}.dead"
    os.rename(path, leftover)
    assert blobs.settle(BlobFile(leftover.name, sha256, 0, 0.0), time.time() - 3600) is None
    assert path.read_bytes() == b"left" and not leftover.exists()

    leftover.write_bytes(b"left")  # a young copy a dead sweep moved aside, while
    newer = path.stat().st_ino  # a publish has stored the content again since
    assert blobs.settle(BlobFile(leftover.name, sha256, 0, 0.0), time.time() - 3600) is None
    assert path.stat().st_ino == newer and not leftover.exists()

    leftover.write_bytes(b"left")
    _age(leftover, 7200)
    doomed = blobs.settle(BlobFile(leftover.name, sha256, 0, 0.0), time.time() - 3600)
    assert doomed is not None and doomed.size == 4 and leftover.exists()
