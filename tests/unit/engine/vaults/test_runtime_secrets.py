"""Secrets at runtime (issue 17): each execution decrypts the session's credentials in memory,
operator tools get them by name, sandboxed commands only placeholders, and nothing a turn
stores (items, events, results, streamed deltas, log lines, the run's context) holds a value."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import sqlalchemy as sa

import cairn
from cairn.engine.sessions import SessionService
from cairn.engine.tools.workspace import BUILTIN_TOOLS
from cairn.engine.vaults import VaultService
from cairn.engine.vaults.injection import load_session_secrets
from cairn.errors import InvalidRequestError
from cairn.operator import LoadedAgent, LoadedAgents
from cairn.redaction import REDACTED, redacted_log_records
from cairn.store.tables import credentials, data_keys, turns
from tests.unit.engine.harness import EngineHarness

pytestmark = pytest.mark.anyio

TOKEN = "tok_9f2Kx7QpLm3Zr8Vw"
API_KEY = "key-0123456789abcdef"
FETCHED = "fetched-7Hq2mWx9Lp"
VALUES = (TOKEN, API_KEY, FETCHED)

log = logging.getLogger("test_runtime_secrets")


@cairn.tool
async def use_token(ctx: cairn.ToolContext) -> str:
    """Call an API with the deploy token."""
    credential = ctx.credentials["deploy-token"]
    assert isinstance(credential, cairn.StaticBearer)
    log.warning("calling the API with %s", credential.token)
    return f"Bearer {credential.token}"


@cairn.tool
async def fetch_secret(ctx: cairn.ToolContext) -> str:
    """Fetch a secret from elsewhere, registered for redaction."""
    ctx.register_secret(FETCHED)
    return f"fetched {FETCHED}"


@cairn.tool
async def remember(ctx: cairn.ToolContext, ticket: int, note: str = "") -> str:
    """Keep a ticket (and a note) for the rest of the turn."""
    ctx.context["ticket"] = ticket
    if note:
        ctx.context["note"] = note
    return "kept"


@cairn.tool
async def remember_client(ctx: cairn.ToolContext) -> str:
    """Keep something the agent does not declare."""
    ctx.context["client"] = "a connection"
    return "kept"


@cairn.tool
async def remember_token(ctx: cairn.ToolContext) -> str:
    """Keep the deploy token in the run's context (what the SDK would store in clear)."""
    credential = ctx.credentials["deploy-token"]
    assert isinstance(credential, cairn.StaticBearer)
    ctx.context["note"] = f"token={credential.token}"
    return "kept"


@cairn.tool
async def recall(ctx: cairn.ToolContext) -> str:
    """What the run's context holds."""
    return json.dumps(dict(ctx.context), sort_keys=True)


@cairn.tool(needs_approval=True, review=lambda arguments: {**arguments, "auth": f"Bearer {TOKEN}"})
async def deploy(ctx: cairn.ToolContext, release: str) -> str:
    """Deploy a release; its review (carelessly) shows the token."""
    return f"deployed {release}"


ASK = {"type": "function", "name": "ask_user", "description": "Ask the user.", "parameters": {"type": "object", "properties": {}}}


def _agents() -> LoadedAgents:
    agent = cairn.Agent(
        model="scripted:test",
        tools=[use_token, fetch_secret, remember, remember_client, remember_token, recall, deploy, "shell"],
        context={"ticket": int, "note": str},
    )
    return LoadedAgents([LoadedAgent("vault-agent/v1", agent, BUILTIN_TOOLS)])


async def _vault(engine: EngineHarness, *, token: str = TOKEN) -> str:
    service = VaultService(engine.runtime)
    vault = await service.create_vault("t1", name="deploys", metadata={})
    await service.create_credential("t1", vault.id, name="deploy-token", metadata={},
                                    auth={"type": "static_bearer", "mcp_server_url": "https://deploy.example.com/mcp", "token": token})
    await service.create_credential("t1", vault.id, name="api-key", metadata={}, auth={
        "type": "environment_variable", "secret_name": "API_KEY", "secret_value": API_KEY,
        "networking": {"type": "limited", "allowed_hosts": ["api.example.com"]}})
    return vault.id


async def _session(engine: EngineHarness, *steps: dict[str, Any], **kwargs: Any) -> str:
    """A session of the vault agent with the deploy vault, whose first turn plays `steps`."""
    engine.script(list(steps) or [{"say": "hello"}])
    await engine.restart(agents=_agents())
    vault_id = await _vault(engine)
    return await engine.create_session(agent_id="vault-agent", tools=[ASK], vault_ids=[vault_id], **kwargs)


def _stored(engine: EngineHarness) -> bytes:
    """Every byte of the data dir (the database file and its WAL included)."""
    return b"".join(p.read_bytes() for p in sorted(engine.settings.data_dir.rglob("*")) if p.is_file())


async def test_tools_get_credentials_the_sandbox_placeholders_and_nothing_stored_holds_a_value(
    engine: EngineHarness, caplog: pytest.LogCaptureFixture
) -> None:
    steps = [{"call": "use_token"}, {"call": "shell", "arguments": {"command": "print"}}, {"call": "fetch_secret"},
             {"say": f"done with {TOKEN} and {FETCHED}"}]
    session_id = await _session(engine, *steps, env={"REGION": "eu-west-1"})
    # The command's output holds the token split between two chunks.
    engine.sandbox.replies["print"] = ([b"value: " + TOKEN[:6].encode(), TOKEN[6:].encode() + b"\n"], 0)
    with redacted_log_records(engine.runtime.redactors), caplog.at_level(logging.WARNING):
        published = await engine.run_job()

    [command] = engine.sandbox.commands
    placeholder = command.env["API_KEY"]
    assert placeholder.startswith("cairn-placeholder-") and command.env["REGION"] == "eu-west-1"
    assert not any(v in json.dumps(command.env) for v in VALUES)
    outputs = [i.data["output"] for i in await engine.items(session_id) if i.type == "function_call_output"]
    assert outputs == [f"Bearer {REDACTED}", f"fetched {REDACTED}"]
    [shell] = [i for i in await engine.items(session_id) if i.type == "command_execution"]
    assert shell.data["output"] == f"value: {REDACTED}\n"
    events = [e for batch in published for e in batch]
    deltas = "".join(e["delta"] for e in events if e["type"] == "agent.output.command_execution_output.delta")
    assert deltas == f"value: {REDACTED}\n"
    text = "".join(e["delta"] for e in events if e["type"] == "agent.session.turn.output_text.delta")
    assert text == f"done with {REDACTED} and {REDACTED}"
    stored = json.dumps([i.data for i in await engine.items(session_id)]) + json.dumps(await engine.events(session_id))
    assert not any(v in stored for v in VALUES) and REDACTED in stored
    assert not any(v.encode() in _stored(engine) for v in VALUES)
    assert "calling the API with [redacted]" in caplog.text and TOKEN not in caplog.text
    # Nothing of them is held once the execution is over.
    assert engine.runtime.redactors.for_session(session_id).is_empty


async def test_a_split_command_stream_and_a_secret_spanning_model_deltas_never_show_a_value(engine: EngineHarness) -> None:
    session_id = await _session(engine, {"call": "shell", "arguments": {"command": "many"}}, {"say": f"{TOKEN}{TOKEN}"})
    engine.sandbox.replies["many"] = ([c.encode() for c in f"a{TOKEN}b"], 0)  # one character per chunk
    events = [e for batch in await engine.run_job() for e in batch]
    deltas = [e["delta"] for e in events if e["type"].endswith("delta")]
    assert "".join(deltas) == f"a{REDACTED}b{REDACTED}{REDACTED}"
    assert TOKEN not in json.dumps(await engine.events(session_id))


async def test_placeholders_are_stable_per_value_and_session_and_change_with_a_rotation(engine: EngineHarness) -> None:
    session_id = await _session(engine)
    other_id = await engine.create_session(agent_id="vault-agent", vault_ids=(await engine.session(session_id)).vault_ids)
    first = await load_session_secrets(engine.runtime, await engine.session(session_id))
    again = await load_session_secrets(engine.runtime, await engine.session(session_id))
    other = await load_session_secrets(engine.runtime, await engine.session(other_id))
    assert first.env == again.env and first.env["API_KEY"] != other.env["API_KEY"]
    [wire] = first.wire
    assert (wire.env_name, wire.value, wire.allowed_hosts) == ("API_KEY", API_KEY, ("api.example.com",))
    assert wire.placeholder == first.env["API_KEY"] and API_KEY not in repr(wire)
    assert set(first.tool_credentials) == {"deploy-token", "api-key"} and TOKEN not in repr(first.tool_credentials)
    assert first.known_values.values == {TOKEN, API_KEY}
    [vault_id] = (await engine.session(session_id)).vault_ids
    service = VaultService(engine.runtime)
    page = await service.list_credentials("t1", vault_id, after=None, order="asc", limit=10, metadata={}, statuses=["active"])
    api_key = next(c for c in page.data if c.name == "api-key")
    await service.update_credential("t1", vault_id, api_key.id, {"auth": {"type": "environment_variable", "secret_value": "key-rotated-0001"}})
    rotated = await load_session_secrets(engine.runtime, await engine.session(session_id))
    assert rotated.env["API_KEY"] != first.env["API_KEY"] and rotated.wire[0].value == "key-rotated-0001"


async def test_the_first_vault_named_wins_for_a_credential_name(engine: EngineHarness) -> None:
    engine.script([{"say": "hello"}])
    await engine.restart(agents=_agents())
    first, second = await _vault(engine), await _vault(engine, token="tok_second_vault_1")
    session_id = await engine.create_session(agent_id="vault-agent", vault_ids=[second, first])
    secrets = await load_session_secrets(engine.runtime, await engine.session(session_id))
    token = secrets.tool_credentials["deploy-token"]
    assert isinstance(token, cairn.StaticBearer) and token.token == "tok_second_vault_1"
    assert secrets.known_values.values == {TOKEN, "tok_second_vault_1", API_KEY}
    with pytest.raises(KeyError, match="no credential 'missing'"):
        secrets.tool_credentials["missing"]


async def test_a_credential_that_does_not_open_fails_the_turn_before_it_starts(engine: EngineHarness) -> None:
    session_id = await _session(engine, {"say": "never"})
    async with engine.runtime.db.write() as conn:
        rows = (await conn.execute(sa.select(credentials.c.id, credentials.c.secret))).all()
        # The two credentials' secrets swapped: each names the other's data key.
        await conn.execute(sa.update(credentials).where(credentials.c.id == rows[0][0]).values(secret=rows[1][1]))
    await engine.run_job()
    turn = await engine.turn(engine.turn_ids[session_id])
    assert turn.status == "failed" and turn.error is not None and turn.error["code"] == "state_deserialize_failure"


async def test_a_session_env_holding_a_credentials_value_is_refused(engine: EngineHarness) -> None:
    engine.script([{"say": "hello"}])
    await engine.restart(agents=_agents())
    vault_id = await _vault(engine)
    with pytest.raises(InvalidRequestError) as refused:
        await engine.create_session(agent_id="vault-agent", vault_ids=[vault_id], env={"AUTH": f"Bearer {TOKEN}"})
    assert refused.value.param == "environment.env.AUTH" and TOKEN not in refused.value.message


# -- the run's persisted context ----------------------------------------------------------


async def _answer(engine: EngineHarness, session_id: str) -> None:
    [item] = [i for i in await engine.items(session_id) if i.type == "function_call" and i.data["name"] == "ask_user"]
    event = {"type": "agent.session.input.tool_result", "turn_id": item.turn_id, "call_id": item.call_id, "success": True, "output": "yes"}
    await SessionService(engine.runtime).submit("t1", session_id, [event], idempotency=None)


async def test_declared_context_survives_a_pause_and_a_restart_sealed(engine: EngineHarness) -> None:
    session_id = await _session(engine, {"call": "remember", "arguments": {"ticket": 42, "note": "rollout"}}, {"call": "ask_user"},
                   {"call": "recall"}, {"say": "done"})
    await engine.run_job()
    turn = await engine.turn(engine.turn_ids[session_id])
    assert turn.status == "waiting" and turn.context is not None
    assert b"rollout" not in turn.context and b"ticket" not in turn.context  # sealed
    await _answer(engine, session_id)
    await engine.restart(agents=_agents())
    await engine.run_job()
    outputs = [i.data.get("output") for i in await engine.items(session_id) if i.type == "function_call_output"]
    assert outputs[-1] == json.dumps({"note": "rollout", "ticket": 42}, sort_keys=True)
    done = await engine.turn(engine.turn_ids[session_id])
    assert done.status == "completed" and done.context is None  # it went with its turn
    async with engine.runtime.db.read() as conn:
        kinds = (await conn.execute(sa.select(data_keys.c.kind))).scalars().all()
    assert "run_context" not in kinds


@pytest.mark.parametrize(("tool", "refusal"), [
    ("remember_client", "holds 'client', which its agent does not declare"),
    ("remember_token", "value 'note' holds a secret value of the session"),
])
async def test_an_undeclared_or_secret_context_value_is_refused_at_the_pause(engine: EngineHarness, tool: str, refusal: str) -> None:
    session_id = await _session(engine, {"call": tool}, {"call": "ask_user"}, {"say": "never"})
    await engine.run_job()
    turn = await engine.turn(engine.turn_ids[session_id])
    assert turn.status == "failed" and turn.error is not None and turn.error["code"] == "run_state_refused"
    assert refusal in turn.error["message"] and TOKEN not in turn.error["message"]
    assert turn.context is None and (await engine.session(session_id)).required_actions == ()
    async with engine.runtime.db.read() as conn:
        assert (await conn.execute(sa.select(turns.c.context).where(turns.c.id == turn.id))).scalar() is None
    assert TOKEN.encode() not in _stored(engine)


async def test_an_approval_request_whose_review_shows_a_secret_is_refused(engine: EngineHarness) -> None:
    engine.gated = True
    session_id = await _session(engine, {"call": "deploy", "arguments": {"release": "r-1"}}, {"say": "never"})
    await engine.run_job()
    turn = await engine.turn(engine.turn_ids[session_id])
    assert turn.status == "failed" and turn.error is not None and turn.error["code"] == "run_state_refused"
    assert "review" in turn.error["message"] and (await engine.session(session_id)).required_actions == ()
    assert TOKEN.encode() not in _stored(engine)


async def test_an_oauth_credential_gives_its_access_token_and_every_secret_field_is_redacted(engine: EngineHarness) -> None:
    engine.script([{"say": "hello"}])
    await engine.restart(agents=_agents())
    service = VaultService(engine.runtime)
    vault = await service.create_vault("t1", name="mcp", metadata={})
    refresh = {"client_id": "cairn", "token_endpoint": "https://auth.example.com/token", "refresh_token": "refresh-0123456789",
               "token_endpoint_auth": {"type": "client_secret_post", "client_secret": "client-secret-0123"}}
    await service.create_credential("t1", vault.id, name="mcp", metadata={}, auth={
        "type": "mcp_oauth", "mcp_server_url": "https://mcp.example.com/mcp", "access_token": "access-0123456789",
        "expires_at": 1_900_000_000, "refresh": refresh})
    session_id = await engine.create_session(agent_id="vault-agent", vault_ids=[vault.id])
    secrets = await load_session_secrets(engine.runtime, await engine.session(session_id))
    oauth = secrets.tool_credentials["mcp"]
    assert isinstance(oauth, cairn.McpOAuth)
    assert (oauth.access_token, oauth.expires_at, oauth.mcp_server_url) == ("access-0123456789", 1_900_000_000, "https://mcp.example.com/mcp")
    assert secrets.known_values.values == {"access-0123456789", "refresh-0123456789", "client-secret-0123"}
    assert secrets.env == {} and secrets.wire == ()
