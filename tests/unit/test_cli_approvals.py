"""`cairn keys set-role` and the failures of `cairn approvals` that need no server."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from cairn.cli import main


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "data"
    assert main(["db", "upgrade", "--data-dir", str(directory)]) == 0
    return directory


def test_a_keys_role_changes_and_an_unknown_key_is_an_error(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "create", "--data-dir", str(data_dir), "--tenant", "t1", "--role", "member"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert main(["keys", "set-role", "--data-dir", str(data_dir), created["id"], "approver"]) == 0
    assert json.loads(capsys.readouterr().out) == {"id": created["id"], "tenant": "t1", "role": "approver"}
    assert main(["keys", "list", "--data-dir", str(data_dir)]) == 0
    assert [json.loads(line)["role"] for line in capsys.readouterr().out.splitlines()] == ["approver"]
    assert main(["keys", "set-role", "--data-dir", str(data_dir), "key_nope", "admin"]) == 2
    assert "no live key" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["keys", "set-role", "--data-dir", str(data_dir), created["id"], "owner"])


def test_approvals_commands_say_why_they_cannot_ask_the_server(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["approvals", "list", "--data-dir", str(data_dir)]) == 2
    assert "no --api-key given and no admin key" in capsys.readouterr().err
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    url = f"http://127.0.0.1:{closed_port}/v1"
    assert main(["approvals", "show", "apr_x", "--base-url", url, "--api-key", "k"]) == 2
    assert "cannot reach" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["approvals", "approve", "apr_x", "--base-url", url, "--api-key", "k"])  # --digest is required
