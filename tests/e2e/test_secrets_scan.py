"""No credential's value is ever stored (issue 17, design invariant 6): a whole-data-dir scan.

Real processes (an API server without workers, `cairn worker` processes, the bubblewrap
sandbox) on SQLite and on PostgreSQL. A session of `secrets_agents` has a vault with a bearer
token and an API key in an environment variable. Its turn runs a sandboxed command that prints
the variable (and its Base64) and writes it under /workspace/outputs, returns the API key from
an operator tool, raises with the token, then pauses on an approval; the worker that paused it
stops, another process approves, a third worker resumes the turn, whose tool uses the token,
logs it and returns it, and whose last command prints the real token (the model knows its two
halves) and writes it, plain and in Base64, into the workspace. Then every byte under the data
dir (the database file and its WAL, blobs, snapshots, workspaces, keys) and the processes' logs,
and for PostgreSQL a `pg_dump` and the server's own data directory, are searched for both
values, and for the password a runtime dependency of the tool holds, plain and Base64: 0 hits.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cairn.redaction import REDACTED
from cairn.testing.postgres import ThrowawayPostgres
from tests.e2e.conftest import DATABASES, database_url_for
from tests.e2e.deployment import SESSIONS, Deployment
from tests.waits import until_blocking

AGENTS = "secrets_agents:registry"


def _needles(value: str) -> dict[str, bytes]:
    """The value and its Base64 forms (whole, and the characters that encode only its bytes at
    each alignment inside a longer Base64 text)."""
    raw = value.encode()
    found = {"plain": raw}
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode().rstrip("=")
        inner = encoded[-(-8 * offset // 6) : (8 * (offset + len(raw))) // 6]
        found[f"base64 at offset {offset}"] = inner.encode()
        found[f"url-safe base64 at offset {offset}"] = inner.translate(str.maketrans("+/", "-_")).encode()
    return found


def _hits(blob: bytes, values: dict[str, str]) -> list[str]:
    return [f"{name} ({form})" for name, value in values.items() for form, needle in _needles(value).items() if needle in blob]


def scan(root: Path, values: dict[str, str]) -> list[str]:
    """Every file under `root` holding one of `values` in a form of `_needles`.

    A live directory (a running PostgreSQL's, whose checkpointer recycles WAL segments by
    renaming them) may lose a file between the listing and its reading: the whole tree is
    then listed and read again, so a renamed file is read under its new name."""
    for _ in range(5):
        found: list[str] = []
        vanished = False
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            try:
                blob = path.read_bytes()
            except FileNotFoundError:
                vanished = True
                continue
            found += [f"{path}: {hit}" for hit in _hits(blob, values)]
        if not vanished:
            return found
    raise AssertionError(f"files under {root} kept vanishing during 5 scans")


class SecretsDeployment(Deployment):
    """The deployment with a vault of two credentials whose values the tests know."""

    def __init__(self, scripts_dir: Path, database_url: str | None) -> None:
        password = f"pw-{secrets.token_hex(16)}"
        super().__init__(scripts_dir, database_url, agents=AGENTS, env={"CAIRN_TEST_DEPS_PASSWORD": password})
        # The runtime dependency's password is no credential (nothing redacts it): it is simply never serialized.
        self.values = {"token": f"tok_{secrets.token_urlsafe(24)}", "api key": f"key-{secrets.token_hex(20)}", "deps password": password}
        with self.http() as http:
            vault = http.post("/vaults", json={"name": "deploys"})
            assert vault.status_code == 200, vault.text
            self.vault_id = str(vault.json()["id"])
            credentials = [
                {"name": "deploy-token", "auth": {"type": "static_bearer", "mcp_server_url": "https://deploy.example.com/mcp",
                                                  "token": self.values["token"]}},
                {"name": "api-key", "auth": {"type": "environment_variable", "secret_name": "API_KEY",
                                             "secret_value": self.values["api key"], "networking": {"type": "unrestricted"}}},
            ]
            for body in credentials:
                created = http.post(f"/vaults/{self.vault_id}/credentials", json=body)
                assert created.status_code == 200, created.text
                self.last_credential_id = str(created.json()["id"])

    def script(self, turns: list[list[dict[str, Any]]]) -> str:
        """A `scripted:` model playing `turns`, written where every process reads scripts."""
        name = f"secrets_{secrets.token_hex(4)}"
        (self.scripts_dir / f"{name}.json").write_text(json.dumps({"turns": turns}))
        return f"scripted:{name}"

    def start(self, model: str, **extra: Any) -> str:
        body = {"agent_id": "secrets-agent", "agent": {"model": model}, "environment": {"type": "openai_hosted", **extra},
                "vault_ids": [self.vault_id], "input": "deploy"}
        with self.http() as http:
            response = http.post(SESSIONS, json=body)
            assert response.status_code == 200, response.text
            session = response.json()
        assert session["environment"]["sandbox"]["backend"] == "bwrap", session["environment"]["sandbox"]
        return str(session["id"])

    def commands(self, session_id: str) -> list[dict[str, Any]]:
        return [i for i in self.items(session_id) if i["type"] == "command_execution"
                or (i["type"] == "mcp_call" and i["name"] == "shell")]

    def turn_statuses(self, session_id: str) -> list[str]:
        with self.http() as http:
            return [t["status"] for t in http.get(f"{SESSIONS}/{session_id}/turns").json()["data"]]

    def workspace_file(self, session_id: str, path: str) -> str:
        return (self.api.data_dir / "workspaces" / session_id / path).read_text()


@pytest.fixture(params=DATABASES)
def deployment(request: pytest.FixtureRequest, scripts_dir: Path) -> Iterator[SecretsDeployment]:
    instance = SecretsDeployment(scripts_dir, database_url_for(request, request.param, "secrets"))
    try:
        yield instance
    finally:
        instance.close()


_PRINT_AND_PUBLISH = (
    'echo "API_KEY=$API_KEY"; printf %s "$API_KEY" | base64 -w0; echo; '
    'mkdir -p /workspace/outputs && printf "%s\\n" "$API_KEY" > /workspace/outputs/api_key.txt'
)


def test_the_scan_finds_a_value_in_each_form(tmp_path: Path) -> None:
    values = {"token": f"tok_{secrets.token_urlsafe(24)}"}
    for name, needle in _needles(values["token"]).items():
        (tmp_path / "planted").write_bytes(b"{\"x\": \"AB" + needle + b"==\"}")
        assert f"{tmp_path / 'planted'}: token ({name})" in scan(tmp_path, values)
    encoded = base64.b64encode(b'{"Authorization": "Bearer ' + values["token"].encode() + b'"}')
    (tmp_path / "planted").write_bytes(encoded)
    assert scan(tmp_path, values)


def test_no_credential_value_anywhere_in_the_data_dir_logs_or_database_after_a_pause_and_resume(
    deployment: SecretsDeployment, request: pytest.FixtureRequest
) -> None:
    token = deployment.values["token"]
    half = len(token) // 2
    # The model knows the token in two halves (no item ever holds it whole): the agent itself
    # prints it, writes it into an output and writes its Base64 into the workspace.
    write_token = (f"printf '%s%s\\n' '{token[:half]}' '{token[half:]}'; "
                   f"printf '%s%s' '{token[:half]}' '{token[half:]}' > /workspace/outputs/leak.txt; "
                   f"mkdir -p notes && printf '%s%s' '{token[:half]}' '{token[half:]}' | base64 > notes/leak.b64")
    model = deployment.script([[
        {"call": "shell", "arguments": {"command": _PRINT_AND_PUBLISH}},
        {"call": "show_api_key", "arguments": {}},
        {"call": "fail_with_token", "arguments": {}},
        {"call": "open_ticket", "arguments": {"title": "deploy prod"}},
        {"call": "use_token", "arguments": {"target": "prod"}},
        {"call": "shell", "arguments": {"command": write_token}},
        {"say": "deployed"},
    ]])
    worker = deployment.worker()
    session_id = deployment.start(model)
    session = deployment.wait_session(session_id, "requires_action")
    [action] = session["required_actions"]
    assert action["request"]["name"] == "use_token" and deployment.deploys() == []
    # Paused: the worker that paused it goes away (persisting the workspace), another process
    # approves, a third takes the turn up and decrypts the credentials again.
    assert worker.stop() == 0, worker.log_since_start()
    deployment.workers.clear()
    deployment.approve(action["request_id"])
    deployment.worker()
    deployment.turn_done(session_id)
    assert deployment.turn_statuses(session_id) == ["completed"]

    # The tool got the real token at the resume (its digest, recorded outside the data dir).
    login = hashlib.sha256(deployment.values["deps password"].encode()).hexdigest()[:12]
    # ... and the ticket the first worker kept in the run's context, before the pause.
    assert deployment.deploys() == [f"prod {hashlib.sha256(token.encode()).hexdigest()} {login} T-11"]
    items = deployment.items(session_id)
    printed, written = deployment.commands(session_id)
    placeholder = printed["output"].splitlines()[0].removeprefix("API_KEY=")
    assert placeholder.startswith("cairn-placeholder-") and deployment.values["api key"] not in placeholder
    assert deployment.workspace_file(session_id, "outputs/api_key.txt") == placeholder + "\n"
    assert written["output"] == REDACTED + "\n" and written["status"] == "completed"
    shown = next(i for i in items if i["type"] == "function_call_output" and "API_KEY is" in (i.get("output") or ""))
    assert shown["output"] == f"API_KEY is {REDACTED} (the sandbox sees {placeholder})"
    failed = next(i for i in items if i["type"] == "function_call_output" and i.get("error"))
    assert failed["error"] == f"the deploy API refused token {REDACTED}"
    used = deployment.call_item(session_id)
    assert used["status"] == "completed" and used["output"] == f"called prod with Authorization: Bearer {REDACTED}"
    # What the agent itself wrote into its workspace: the value replaced there, before it was
    # published or persisted (docs/security.md).
    assert deployment.workspace_file(session_id, "outputs/leak.txt") == REDACTED
    assert deployment.workspace_file(session_id, "notes/leak.b64") == REDACTED + "\n"
    with deployment.http() as http:
        listed = http.get(f"{SESSIONS}/{session_id}/artifacts").json()["data"]
        leak = next(a for a in listed if a["path"] == "/workspace/outputs/leak.txt")
        assert http.get(f"{SESSIONS}/{session_id}/artifacts/{leak['id']}/content").text == REDACTED

    # Everything stops (workspaces persisted as snapshots, logs flushed), then the search.
    deployment.stop_workers()
    deployment.api.stop()
    logs = "".join(p.read_text(errors="replace") for p in deployment.api.data_dir.parent.glob("*.log"))
    assert "calling prod with Authorization: Bearer [redacted]" in logs
    assert "the deploy API refused token [redacted]" in logs  # the tool's traceback, logged
    assert any((deployment.api.data_dir / "snapshots").rglob("*")), "no snapshot was persisted"
    found = scan(deployment.api.data_dir.parent, deployment.values)
    if deployment.database_url is not None:
        pg: ThrowawayPostgres = request.getfixturevalue("postgres_server")
        database = deployment.database_url.rsplit("/", 1)[1]
        dump = subprocess.run([str(pg.bin_dir / "pg_dump"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", database],
                              capture_output=True, check=True).stdout
        assert b"CREATE TABLE public.credentials" in dump and b"COPY public.items" in dump
        found += [f"pg_dump: {hit}" for hit in _hits(dump, deployment.values)]
        found += scan(pg.root / "data", deployment.values)
    assert found == []


@pytest.fixture
def sqlite_deployment(scripts_dir: Path) -> Iterator[SecretsDeployment]:
    instance = SecretsDeployment(scripts_dir, None)
    try:
        yield instance
    finally:
        instance.close()


def test_sandboxed_code_sees_a_placeholder_stable_per_value_never_the_value(sqlite_deployment: SecretsDeployment) -> None:
    deployment = sqlite_deployment
    key = deployment.values["api key"]
    turn = [{"call": "shell", "arguments": {"command": _PRINT_AND_PUBLISH}}, {"say": "published"}]
    model = deployment.script([turn, turn, turn])
    deployment.worker()
    session_id = deployment.start(model, env={"REGION": "eu-west-1"})
    deployment.turn_done(session_id)

    def placeholder() -> str:
        [command] = deployment.commands(session_id)[-1:]
        shown, encoded = command["output"].splitlines()
        value = shown.removeprefix("API_KEY=")
        assert value.startswith("cairn-placeholder-") and key not in command["output"]
        assert base64.b64decode(encoded).decode() == value  # what the sandbox had is the placeholder
        assert deployment.workspace_file(session_id, "outputs/api_key.txt") == value + "\n"
        return value

    def next_turn() -> None:
        turns = len(deployment.turn_statuses(session_id))
        message = {"type": "agent.session.input.message", "input": [{"role": "user", "content": [{"type": "input_text", "text": "again"}]}]}
        with deployment.http() as http:
            assert http.post(f"{SESSIONS}/{session_id}/events", json={"events": [message]}).status_code == 202
        until_blocking(lambda: deployment.turn_statuses(session_id) == ["completed"] * (turns + 1),
                       f"turn {turns + 1} of {session_id} to complete", timeout_s=60, interval_s=0.05,
                       seen=lambda: deployment.turn_statuses(session_id))

    first = placeholder()
    # Another worker, another execution: the same placeholder for the same value.
    deployment.stop_workers()
    deployment.worker()
    next_turn()
    assert placeholder() == first
    # A rotated value has a new placeholder; another session has its own.
    with deployment.http() as http:
        rotated = http.post(f"/vaults/{deployment.vault_id}/credentials/{deployment.last_credential_id}",
                            json={"auth": {"type": "environment_variable", "secret_value": f"key-{secrets.token_hex(20)}"}})
        assert rotated.status_code == 200, rotated.text
    next_turn()
    assert placeholder() not in (first, key)
    other = deployment.start(deployment.script([turn]))
    deployment.turn_done(other)
    [command] = deployment.commands(other)
    assert first not in command["output"] and "cairn-placeholder-" in command["output"]


def test_a_session_env_holding_a_credentials_value_is_refused_without_echoing_it(sqlite_deployment: SecretsDeployment) -> None:
    deployment = sqlite_deployment
    body = {"agent_id": "secrets-agent", "agent": {"model": "scripted:echo"}, "vault_ids": [deployment.vault_id],
            "environment": {"type": "openai_hosted", "env": {"REGION": "eu", "TOKEN": f"Bearer {deployment.values['token']}"}}}
    with deployment.http() as http:
        refused = http.post(SESSIONS, json=body)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "environment.env.TOKEN", refused.text
    assert deployment.values["token"] not in refused.text and "vault" in refused.json()["error"]["message"]


def test_a_pause_that_would_store_a_secret_in_the_runs_context_fails_the_turn_visibly(
    sqlite_deployment: SecretsDeployment,
) -> None:
    deployment = sqlite_deployment
    model = deployment.script([[{"call": "keep_token", "arguments": {}}, {"call": "use_token", "arguments": {"target": "prod"}},
                                {"say": "never"}]])
    deployment.worker()
    session_id = deployment.start(model)
    deployment.turn_done(session_id)
    with deployment.http() as http:
        [turn] = http.get(f"{SESSIONS}/{session_id}/turns").json()["data"]
        approvals = http.get("/approvals", params={"session_id": session_id}).json()["data"]
    assert turn["status"] == "failed" and turn["error"]["code"] == "run_state_refused", turn
    assert "'ticket' holds a secret value" in turn["error"]["message"]
    assert [a["status"] for a in approvals] == ["revoked"] and deployment.deploys() == []
    deployment.stop_workers()
    assert scan(deployment.api.data_dir, deployment.values) == []
