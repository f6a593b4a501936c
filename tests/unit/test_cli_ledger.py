"""The failures of `cairn ledger` that need no server: one outcome exactly, and a server that
cannot be reached said so."""

from __future__ import annotations

import socket

import pytest

from cairn.cli import main


def _closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


@pytest.mark.parametrize("outcome", [[], ["--succeeded", "ok", "--failed", "no"]])
def test_resolve_takes_exactly_one_outcome(outcome: list[str]) -> None:
    with pytest.raises(SystemExit):
        main(["ledger", "resolve", "op_x", "--base-url", _closed_url(), "--api-key", "k", *outcome])


@pytest.mark.parametrize("command", [["list", "--status", "uncertain"], ["show", "op_x"], ["resolve", "op_x", "--failed", "no"]])
def test_an_unreachable_server_is_a_one_line_error(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", *command, "--base-url", _closed_url(), "--api-key", "k"]) == 2
    assert "cannot reach" in capsys.readouterr().err
