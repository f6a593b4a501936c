"""The egress proxy's reports on the session's log, and a session's network as the shell
tool hands it to the sandbox."""

from __future__ import annotations

import json

import anyio
import pytest

from cairn.engine.egress_events import record_egress_events
from cairn.engine.runtime import Runtime
from cairn.engine.sessions import SessionService
from cairn.engine.tools.shell import session_egress
from cairn.errors import InvalidRequestError
from cairn.sandbox.egress import EgressEvent, EgressKind, NetworkPolicy, WireSecret
from cairn.store.events import read_events_after
from cairn.store.sessions import list_tenants
from tests.waits import until

pytestmark = pytest.mark.anyio

@pytest.fixture(autouse=True)
def echo_script(runtime: Runtime) -> None:
    assert runtime.settings.scripts_dir is not None
    (runtime.settings.scripts_dir / "echo.json").write_text('{"turns": [[{"say": "hi"}]]}')


NETWORK = {"access": "restricted", "allowed_domains": ["Api.Example.com", "*.example.org"], "blocked_domains": ["x.example.org"]}


@pytest.mark.parametrize("kind", ["network_blocked", "credential_redacted", "response_encoded"])
async def test_the_proxys_reports_land_on_the_sessions_log(runtime: Runtime, kind: EgressKind) -> None:
    created = await SessionService(runtime).create(
        "t1", {"agent": {"model": "scripted:echo"}, "environment": {"type": "openai_hosted", "network": NETWORK}}
    )
    session = created.session
    assert runtime.egress is not None

    async def reported() -> list[dict[str, object]]:
        async with runtime.db.read() as conn:
            events = await read_events_after(conn, session.id, 0, limit=1000)
        decoded = [json.loads(e.data) for e in events]
        return [e for e in decoded if e["type"] == f"agent.session.environment.{kind}"]

    async with anyio.create_task_group() as tg:
        tg.start_soon(record_egress_events, runtime)
        runtime.egress.reports.report(EgressEvent(session.id, kind, "evil.test", 443, "the reason"))
        runtime.egress.reports.report(EgressEvent("sess_gone", kind, "evil.test", 443, "the reason"))
        [event] = await until(reported, f"the {kind} report on the session's log")
        tg.cancel_scope.cancel()
    assert event["network"] == {"host": "evil.test", "port": 443, "reason": "the reason", "suppressed": 0}
    assert event["environment"]["id"] == session.environment_id  # type: ignore[index]


async def test_the_shell_tool_hands_the_sandbox_the_sessions_policy(runtime: Runtime) -> None:
    service = SessionService(runtime)
    restricted = (await service.create(
        "t1", {"agent": {"model": "scripted:echo"}, "environment": {"type": "openai_hosted", "network": NETWORK}}
    )).session
    offline = (await service.create("t1", {"agent": {"model": "scripted:echo"}, "environment": {"type": "openai_hosted"}})).session
    egress = session_egress(restricted)
    assert egress is not None and egress.session_id == restricted.id
    assert egress.policy == NetworkPolicy("restricted", ("api.example.com", "*.example.org"), ("x.example.org",))
    assert restricted.environment["network"]["allowed_domains"] == ["api.example.com", "*.example.org"]
    assert session_egress(offline) is None
    # The execution's credentials travel with it; an unrestricted one goes to the allowed domains.
    secret = WireSecret("cred_1", "API_KEY", "ph_api", "the-value", None)
    with_secret = session_egress(restricted, [secret])
    assert with_secret is not None and with_secret.secrets_for("api.example.com") == (secret,)
    assert session_egress(offline, [secret]) is None


async def test_a_malformed_network_is_refused_before_anything_is_stored(runtime: Runtime) -> None:
    with pytest.raises(InvalidRequestError, match="wildcard"):
        await SessionService(runtime).create("t1", {
            "agent": {"model": "scripted:echo"},
            "environment": {"type": "openai_hosted", "network": {"access": "restricted", "allowed_domains": ["a.*.b"]}},
        })
    async with runtime.db.read() as conn:
        assert await list_tenants(conn) == []
