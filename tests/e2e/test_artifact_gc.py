"""Deleted artifacts' content leaves the disk: by the server's periodic sweep, and by
`cairn blobs gc` run beside a live server, while content still referenced stays."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from cairn.testing.server import CairnServer
from tests.e2e.conftest import make_server, remove_server
from tests.e2e.streams import read_turn
from tests.waits import until_blocking


def _turn(client: openai.OpenAI, session_id: str | None, input: str) -> str:
    sessions = client.beta.agents.sessions
    if session_id is None:
        with sessions.create(agent={"model": "scripted:publish"}, environment={"type": "openai_hosted"}, input=input, stream=True) as stream:
            session_id = read_turn(stream)[0].session.id
        return session_id
    with sessions.stream(session_id, input=input) as turn:
        turn.get_final_result()
    return session_id


def _artifacts(client: openai.OpenAI, session_id: str) -> dict[str, Any]:
    return {a.path.rsplit("/", 1)[-1]: a for a in client.beta.agents.sessions.artifacts.list(session_id)}


def _blob(server: CairnServer, client: openai.OpenAI, session_id: str, artifact_id: str) -> Path:
    content = client.beta.agents.sessions.artifacts.content(artifact_id, session_id=session_id).read()
    sha256 = hashlib.sha256(content).hexdigest()
    path = server.data_dir / "blobs" / sha256[:2] / sha256[2:]
    assert path.is_file()
    return path


def test_the_server_frees_deleted_content_and_keeps_shared_content(scripts_dir: Path) -> None:
    server = make_server(scripts_dir, env={"CAIRN_BLOB_GC_INTERVAL_S": "0.2", "CAIRN_BLOB_GC_GRACE_S": "1"}).start()
    try:
        with server.client() as client:
            sessions = client.beta.agents.sessions
            first = _turn(client, None, "publish")
            second = _turn(client, _turn(client, None, "publish"), "publish again")
            shared = _artifacts(client, second)["shared.txt"]
            own = _artifacts(client, second)["own.txt"]
            shared_blob = _blob(server, client, second, shared.id)
            own_blob = _blob(server, client, second, own.id)
            assert _blob(server, client, first, _artifacts(client, first)["shared.txt"].id) == shared_blob

            # The first session goes, and with it one reference to the shared content.
            sessions.delete(first)
            sessions.artifacts.delete(own.id, session_id=second)
            until_blocking(lambda: not own_blob.exists(), "the sweep to free the deleted artifact's content", timeout_s=30)
            assert shared_blob.exists(), "the second session still references it"

            sessions.artifacts.delete(shared.id, session_id=second)
            until_blocking(lambda: not shared_blob.exists(), "the sweep to free the last reference's content", timeout_s=30)
            with pytest.raises(openai.NotFoundError):
                sessions.artifacts.content(shared.id, session_id=second)
            assert "blob gc: BlobGcReport" in server.log()
    finally:
        remove_server(server)


def _blobs_gc(server: CairnServer, *args: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "cairn.cli", "blobs", "gc", "--data-dir", str(server.data_dir), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_cairn_blobs_gc_beside_a_live_server(server: CairnServer, client: openai.OpenAI) -> None:
    sessions = client.beta.agents.sessions
    session_id = _turn(client, None, "publish")
    artifact = _artifacts(client, session_id)["shared.txt"]
    blob = _blob(server, client, session_id, artifact.id)

    assert _blobs_gc(server, "--grace-s", "0")["blobs_deleted"] == 0, "referenced"
    sessions.artifacts.delete(artifact.id, session_id=session_id)
    dry = _blobs_gc(server, "--grace-s", "0", "--dry-run")
    assert (dry["dry_run"], dry["blobs_deleted"], dry["bytes_freed"]) == (True, 1, artifact.size_bytes)
    assert _blobs_gc(server)["blobs_deleted"] == 0, "within the default grace period (3600 s)"
    assert blob.exists()
    report = _blobs_gc(server, "--grace-s", "0")
    assert (report["blobs_deleted"], report["bytes_freed"], report["failures"]) == (1, artifact.size_bytes, 0)
    assert not blob.exists()
    with pytest.raises(openai.NotFoundError):
        sessions.artifacts.content(artifact.id, session_id=session_id)
    # The server goes on publishing after the sweep.
    _turn(client, session_id, "publish again")
    assert set(_artifacts(client, session_id)) == {"own.txt"}
