"""What an execution wrote into its workspace has the session's secret values replaced in
place; older files, other bytes and files too large to search are left as they are."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import pytest

from cairn.engine.vaults import workspace as workspace_redaction
from cairn.engine.vaults.workspace import redact_workspace
from cairn.engine.workspace_files import WorkspaceFiles
from cairn.redaction import REDACTED, Redactor

pytestmark = pytest.mark.anyio

TOKEN = "tok_9f2Kx7QpLm3Zr8Vw"


async def test_changed_files_are_redacted_in_place_old_ones_and_other_bytes_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    began = time.time_ns()
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "leak.txt").write_text(f"token={TOKEN}\n")
    (tmp_path / "notes.b64").write_text(base64.b64encode(TOKEN.encode()).decode())
    (tmp_path / "binary.bin").write_bytes(b"\xff\xfe" + TOKEN.encode() + b"\x00\x80")
    old = tmp_path / "old.txt"
    old.write_text(TOKEN)
    os.utime(old, ns=(began - 3_600_000_000_000, began - 3_600_000_000_000))
    monkeypatch.setattr(workspace_redaction, "MAX_SCANNED_BYTES", 64)
    (tmp_path / "large.txt").write_text(TOKEN * 10)
    (tmp_path / "link").symlink_to("/etc/passwd")

    changed = await redact_workspace(WorkspaceFiles(tmp_path), Redactor([TOKEN]), since_ns=began)

    assert sorted(changed) == ["binary.bin", "notes.b64", "outputs/leak.txt"]
    assert (tmp_path / "outputs" / "leak.txt").read_text() == f"token={REDACTED}\n"
    assert (tmp_path / "notes.b64").read_text() == REDACTED
    assert (tmp_path / "binary.bin").read_bytes() == b"\xff\xfe" + REDACTED.encode() + b"\x00\x80"
    assert old.read_text() == TOKEN  # written before this execution: not its doing
    assert (tmp_path / "large.txt").read_text() == TOKEN * 10  # too large to search (logged)
    assert (tmp_path / "link").is_symlink()


async def test_nothing_is_read_without_known_values_or_a_workspace(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(TOKEN)
    assert await redact_workspace(WorkspaceFiles(tmp_path), Redactor(), since_ns=0) == []
    assert await redact_workspace(WorkspaceFiles(tmp_path / "missing"), Redactor([TOKEN]), since_ns=0) == []
    assert (tmp_path / "a.txt").read_text() == TOKEN
