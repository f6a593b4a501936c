"""Egress through the public API: a session created with a restricted network runs shell
commands whose only way out is the worker's egress proxy; what the proxy refuses reaches
the session's event log; the network settings are stored as given (normalized) and the
data dir holds the proxy's CA key readable by its owner only; a vault's credential reaches
its host on the wire and nowhere else.
"""

from __future__ import annotations

import json
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.sandbox.egress.testing import LocalUpstream, local_upstream
from cairn.testing.server import CairnServer
from tests.e2e.conftest import make_server, remove_server
from tests.e2e.test_event_replay import stored_log
from tests.e2e.test_secrets_scan import SecretsDeployment, scan
from tests.waits import until_blocking


@pytest.fixture(scope="module")
def upstream() -> Iterator[LocalUpstream]:
    with local_upstream("api.test", tls=False) as server:
        yield server


@pytest.fixture(scope="module")
def egress_server(scripts_dir: Path) -> Iterator[CairnServer]:
    env = {
        "CAIRN_SANDBOX": "bwrap",
        "CAIRN_EGRESS_ALLOW_PRIVATE": "api.test,other.test",
        "CAIRN_EGRESS_HOSTS": "api.test=127.0.0.1,other.test=127.0.0.1,evil.test=127.0.0.1",
    }
    instance = make_server(scripts_dir, env=env).start()
    yield instance
    remove_server(instance)


def stored_events(server: CairnServer, session_id: str) -> list[dict[str, object]]:
    return [json.loads(data) for data in stored_log(f"sqlite:///{server.data_dir / 'cairn.db'}", session_id)]


def test_a_restricted_session_reaches_only_its_domains(
    egress_server: CairnServer, scripts_dir: Path, upstream: LocalUpstream
) -> None:
    name = f"egress_{uuid.uuid4().hex[:10]}"
    urls = [f"http://{host}:{upstream.port}/" for host in ("api.test", "other.test", "evil.test")]
    command = "; ".join(f"echo {url} $(curl -s -m 10 -o /dev/null -w '%{{http_code}}' {url})" for url in urls)
    script = {"turns": [[{"call": "shell", "arguments": {"command": command}}, {"say": "done"}]]}
    (scripts_dir / f"{name}.json").write_text(json.dumps(script))
    network = {"access": "restricted", "allowed_domains": ["API.test."], "blocked_domains": ["*.blocked.test"]}
    with egress_server.client() as client:
        sessions = client.beta.agents.sessions
        with sessions.create(
            agent={"model": f"scripted:{name}"},
            environment={"type": "openai_hosted", "network": network},  # type: ignore[typeddict-item]
            input="go",
            stream=True,
        ) as stream:
            events = list(stream)
        session = events[0].session  # type: ignore[union-attr]
        assert events[-1].type == "agent.session.idle"
        assert session.environment.network.model_dump() == {  # type: ignore[union-attr]
            "access": "restricted", "allowed_domains": ["api.test"], "blocked_domains": ["*.blocked.test"],
        }
        items = list(sessions.items.list(session.id, order="asc", limit=100))
    [command_item] = [item for item in items if item.type == "command_execution"]
    answers = dict(line.split(" ") for line in str(command_item.output).splitlines())
    assert answers == {urls[0]: "200", urls[1]: "403", urls[2]: "403"}
    assert len(upstream.received) == 1

    def blocked() -> list[dict[str, object]]:
        return [e for e in stored_events(egress_server, session.id)
                if e["type"] == "agent.session.environment.network_blocked"]

    refusals = until_blocking(lambda: len(blocked()) == 2 and blocked(), "both refusals on the session's log", timeout_s=30)
    reasons = {event["network"]["host"]: event["network"]["reason"] for event in refusals}  # type: ignore[index]
    assert reasons == {"other.test": "other.test is not in the session's allowed_domains",
                       "evil.test": "evil.test is not in the session's allowed_domains"}
    ca = egress_server.data_dir / "egress-ca" / "ca.pem"
    assert stat.S_IMODE(ca.stat().st_mode) == 0o600


def test_a_credential_reaches_its_host_on_the_wire_and_is_nowhere_in_the_data_dir(scripts_dir: Path) -> None:
    """The whole path on a real deployment: a vault's environment_variable credential, a
    session restricted to the upstream's name, a sandboxed curl sending the placeholder. The
    upstream (its own test CA, which the proxy is told to trust) gets the real secret in the
    header and the body; what the command printed, everything stored, every log and the whole
    data dir hold no trace of it (the secrets issue's scan)."""
    with local_upstream("api.test", tls=True) as upstream:
        egress = {
            "CAIRN_EGRESS_ALLOW_PRIVATE": "api.test",
            "CAIRN_EGRESS_HOSTS": "api.test=127.0.0.1",
            "CAIRN_EGRESS_INTERCEPT_PORTS": str(upstream.port),
            "CAIRN_EGRESS_UPSTREAM_CA": str(upstream.ca_file),
        }
        deployment = SecretsDeployment(scripts_dir, None)
        try:
            secret = deployment.values["api key"]
            # Then the service echoes the request back: the real secret it got comes back
            # to the sandbox as the placeholder (and so is in none of the stored output).
            command = (f'curl -sS -m 20 -H "Authorization: Bearer $API_KEY" -d "key=$API_KEY" '
                       f'https://api.test:{upstream.port}/wire; echo "sent $API_KEY"; '
                       f'curl -sS -m 20 -H "Authorization: Bearer $API_KEY" -d "key=$API_KEY" https://api.test:{upstream.port}/echo')
            model = deployment.script([[{"call": "shell", "arguments": {"command": command}}, {"say": "sent"}]])
            deployment.worker(env=egress)
            session_id = deployment.start(model, network={"access": "restricted", "allowed_domains": ["api.test"]})
            deployment.turn_done(session_id)

            wire, echoed = upstream.received
            for request in (wire, echoed):
                assert request.headers["Authorization"] == f"Bearer {secret}" and request.body == f"key={secret}".encode()
            [printed] = deployment.commands(session_id)
            answer, sent, *echo = printed["output"].splitlines()
            placeholder = sent.removeprefix("sent ")
            assert answer == "ok" and placeholder.startswith("cairn-placeholder-") and secret not in printed["output"]
            assert f"Authorization: Bearer {placeholder}" in echo and echo[-1] == f"key={placeholder}"

            def redacted() -> list[dict[str, object]]:
                return [json.loads(data) for data in stored_log(f"sqlite:///{deployment.api.data_dir / 'cairn.db'}", session_id)
                        if '"agent.session.environment.credential_redacted"' in data]

            [report] = until_blocking(redacted, "the redaction on the session's log", timeout_s=30)
            assert report["network"]["host"] == "api.test"  # type: ignore[index]

            deployment.stop_workers()
            deployment.api.stop()
            assert scan(deployment.api.data_dir.parent, deployment.values) == []
        finally:
            deployment.close()
