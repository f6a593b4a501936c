"""`cairn blobs gc`: output, exit statuses and bad input, on a real data dir."""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from cairn.blobs import BlobStore
from cairn.cli import main
from cairn.ids import new_artifact_id, new_session_id, new_turn_id
from cairn.store.artifacts import ArtifactRecord, insert_artifact
from cairn.store.db import Database
from cairn.store.sessions import SessionRecord, insert_session


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "data"
    assert main(["db", "upgrade", "--data-dir", str(directory)]) == 0
    return directory


def _store(data_dir: Path, content: bytes, *, age_s: float, referenced: bool) -> Path:
    sha256, size = BlobStore(data_dir / "blobs").put_stream(io.BytesIO(content))
    path = BlobStore(data_dir / "blobs").path_of(sha256)
    then = time.time() - age_s
    os.utime(path, (then, then))
    if referenced:
        anyio.run(_reference, data_dir, sha256, size)
    return path


async def _reference(data_dir: Path, sha256: str, size: int) -> None:
    db = Database(f"sqlite:///{data_dir / 'cairn.db'}")
    now = time.time()
    session = SessionRecord(
        id=new_session_id(), tenant="default", status="idle", agent={"model": "scripted:x"}, environment={"type": "none"},
        environment_id="env_1", metadata={}, error=None, usage=None, last_event_seq=0, next_turn_ordinal=0,
        outputs_manifest={}, created_at=now, last_active_at=now,
    )
    try:
        async with db.write() as conn:
            await insert_session(conn, session)
            await insert_artifact(conn, ArtifactRecord(
                id=new_artifact_id(), session_id=session.id, tenant="default", turn_id=new_turn_id(), environment_id="env_1",
                path="/workspace/outputs/a", size_bytes=size, sha256=sha256, created_at=now,
            ))
    finally:
        await db.dispose()


def _gc(capsys: pytest.CaptureFixture[str], data_dir: Path, *args: str) -> tuple[int, dict[str, object] | None, str]:
    code = main(["blobs", "gc", "--data-dir", str(data_dir), *args])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out else None, captured.err


def test_gc_prints_what_it_freed_and_keeps_what_is_referenced(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doomed = _store(data_dir, b"deleted artifact", age_s=7200, referenced=False)
    kept = _store(data_dir, b"live artifact", age_s=7200, referenced=True)

    code, report, _ = _gc(capsys, data_dir, "--dry-run")
    assert code == 0 and report == {
        "dry_run": True, "blobs_scanned": 2, "blobs_deleted": 1, "temp_files_removed": 0,
        "bytes_freed": len(b"deleted artifact"), "failures": 0,
    }
    assert doomed.exists()

    code, report, _ = _gc(capsys, data_dir)
    assert code == 0 and report is not None
    assert (report["dry_run"], report["blobs_deleted"], report["bytes_freed"]) == (False, 1, len(b"deleted artifact"))
    assert not doomed.exists() and kept.exists()


def test_the_grace_period_comes_from_the_environment_unless_given(
    data_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    blob = _store(data_dir, b"half an hour old", age_s=1800, referenced=False)
    monkeypatch.setenv("CAIRN_BLOB_GC_GRACE_S", "3600")
    code, report, _ = _gc(capsys, data_dir)
    assert code == 0 and report is not None and report["blobs_deleted"] == 0 and blob.exists()
    code, report, _ = _gc(capsys, data_dir, "--grace-s", "600")
    assert code == 0 and report is not None and report["blobs_deleted"] == 1 and not blob.exists()


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--grace-s", "-1"], {}, "--grace-s must be a number of seconds, 0 or more"),
        (["--grace-s", "inf"], {}, "--grace-s must be a number of seconds, 0 or more"),
        ([], {"CAIRN_BLOB_GC_GRACE_S": "-5"}, "CAIRN_BLOB_GC_GRACE_S must be a number of seconds"),
        ([], {"CAIRN_BLOB_GC_INTERVAL_S": "soon"}, "bad CAIRN_* setting"),
    ],
)
def test_bad_settings_are_refused_with_a_clear_message(
    data_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    args: list[str], env: dict[str, str], message: str,
) -> None:
    blob = _store(data_dir, b"untouched", age_s=7200, referenced=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, report, err = _gc(capsys, data_dir, *args)
    assert (code, report) == (2, None)
    assert err.startswith("cairn: error: ") and message in err and "Traceback" not in err
    assert blob.exists()


def test_a_grace_period_that_is_not_a_number_is_an_argument_error(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["blobs", "gc", "--data-dir", str(data_dir), "--grace-s", "an hour"])
    assert exited.value.code == 2
    assert "invalid float value: 'an hour'" in capsys.readouterr().err


def test_a_missing_data_dir_or_an_unmigrated_database_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _gc(capsys, tmp_path / "typo")
    assert code == 2 and "no data directory at" in err
    assert not (tmp_path / "typo").exists()
    (tmp_path / "empty").mkdir()
    code, _, err = _gc(capsys, tmp_path / "empty")
    assert code == 2 and "run `cairn db upgrade`" in err


def test_files_that_cannot_be_deleted_make_the_exit_status_1(
    data_dir: Path, capsys: pytest.CaptureFixture[str], refuse_rename: Callable[[Path], None]
) -> None:
    stuck = _store(data_dir, b"stuck", age_s=7200, referenced=False)
    freed = _store(data_dir, b"freed", age_s=7200, referenced=False)
    refuse_rename(stuck)
    code, report, err = _gc(capsys, data_dir)
    assert code == 1 and report is not None
    assert (report["blobs_deleted"], report["failures"]) == (1, 1)
    assert "1 file(s) could not be deleted" in err
    assert stuck.exists() and not freed.exists()
