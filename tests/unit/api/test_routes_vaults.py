"""`/v1/vaults` through the official client, in-process: vaults and credentials of the three
kinds created, read, listed, rotated and deleted as `client.beta.agents.vaults` speaks them;
secret values never in a response, an error, or the database in the clear; tenants, roles,
and sessions naming their vaults."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
import sqlalchemy as sa

from cairn.engine.vaults import VaultService, credential_scope
from cairn.store.tables import credentials, data_keys, vaults
from tests.unit.api.in_process import Api
from tests.unit.engine.harness import EngineHarness

pytestmark = pytest.mark.anyio

TOKEN = "tok-static-0123456789abcdef"
ACCESS = "oauth-access-0123456789"
REFRESH = "oauth-refresh-0123456789"
CLIENT_SECRET = "client-secret-0123456789"
VALUE = "env-value-0123456789abcdef"
SECRETS = (TOKEN, ACCESS, REFRESH, CLIENT_SECRET, VALUE)

STATIC = {"type": "static_bearer", "token": TOKEN, "mcp_server_url": "https://mcp.example.com/mcp"}
OAUTH = {
    "type": "mcp_oauth",
    "access_token": ACCESS,
    "mcp_server_url": "https://mcp.example.com/mcp",
    "expires_at": "2030-01-01T00:00:00Z",
    "refresh": {
        "client_id": "client-1",
        "refresh_token": REFRESH,
        "token_endpoint": "https://auth.example.com/token",
        "token_endpoint_auth": {"type": "client_secret_post", "client_secret": CLIENT_SECRET},
        "scope": "read write",
    },
}
VARIABLE = {"type": "environment_variable", "secret_name": "DEPLOY_TOKEN", "secret_value": VALUE,
            "networking": {"type": "limited", "allowed_hosts": ["API.example.com", "10.0.0.7"]}}


@pytest.fixture
def api(engine: EngineHarness) -> Api:
    return Api(engine)


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


async def secrets_of(api: Api, credential_id: str) -> dict[str, str]:
    """What the credential's sealed secret holds, opened as a turn would."""
    runtime = api.engine.runtime
    async with runtime.db.read() as conn:
        row = (await conn.execute(sa.select(credentials).where(credentials.c.id == credential_id))).one()
        record = await VaultService(runtime).get_credential(row.tenant, row.vault_id, credential_id)
        opened: dict[str, str] = await runtime.sealer.open_json(conn, record.secret, credential_scope(record))
    return opened


async def stored_rows(api: Api) -> str:
    """Every row of the vault tables and data keys, as text (bytes as Latin-1)."""
    async with api.engine.runtime.db.read() as conn:
        rows = [r for table in (vaults, credentials, data_keys) for r in (await conn.execute(sa.select(table))).all()]
    return repr([tuple(v.decode("latin-1") if isinstance(v, bytes) else v for v in r) for r in rows])


async def test_a_vault_is_created_read_updated_listed_and_deleted(api: Api) -> None:
    client = await api.official()
    created = await client.beta.agents.vaults.create(name="  deploy keys ", metadata={"team": "ops"})
    assert (created.object, created.name, created.metadata) == ("vault", "deploy keys", {"team": "ops"})
    assert (await client.beta.agents.vaults.retrieve(created.id)).model_dump() == created.model_dump()
    renamed = await client.beta.agents.vaults.update(created.id, metadata={"team": "sre"})
    assert (renamed.name, renamed.metadata) == ("deploy keys", {"team": "sre"})
    cleared = await client.beta.agents.vaults.update(created.id, name=None)
    assert cleared.name is None and cleared.metadata == {"team": "sre"}
    other = await client.beta.agents.vaults.create()
    listed = [v.id async for v in client.beta.agents.vaults.list(limit=1)]
    assert listed == [other.id, created.id]
    assert [v.id async for v in client.beta.agents.vaults.list(metadata={"team": "sre"})] == [created.id]
    assert [v.id async for v in client.beta.agents.vaults.list(status="archived")] == []
    assert len([v async for v in client.beta.agents.vaults.list(status=["active", "archived"], order="asc")]) == 2
    deleted = await client.beta.agents.vaults.delete(created.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (created.id, "vault.deleted", True)
    with pytest.raises(openai.NotFoundError):
        await client.beta.agents.vaults.retrieve(created.id)


async def test_credentials_of_the_three_kinds_show_their_settings_and_never_a_secret(api: Api) -> None:
    client = await api.official()
    vault = await client.beta.agents.vaults.create(name="v")
    raw: list[str] = []
    made = {}
    for name, auth in (("static", STATIC), ("oauth", OAUTH), ("variable", VARIABLE)):
        response = await client.beta.agents.vaults.credentials.with_raw_response.create(vault.id, name=name, auth=auth)  # type: ignore[arg-type]
        raw.append(response.text)
        made[name] = response.parse()
    static, oauth, variable = made["static"], made["oauth"], made["variable"]
    assert static.object == "vault.credential" and static.vault_id == vault.id
    assert static.auth.model_dump() == {"type": "static_bearer", "mcp_server_url": "https://mcp.example.com/mcp"}
    assert oauth.auth.type == "mcp_oauth" and oauth.auth.expires_at == "2030-01-01T00:00:00Z"
    assert oauth.auth.refresh is not None and oauth.auth.refresh.token_endpoint_auth.type == "client_secret_post"
    assert oauth.auth.refresh.scope == "read write" and oauth.auth.refresh.client_id == "client-1"
    assert variable.auth.type == "environment_variable" and variable.auth.secret_name == "DEPLOY_TOKEN"
    assert variable.auth.networking.model_dump() == {"type": "limited", "allowed_hosts": ["api.example.com", "10.0.0.7"]}
    for credential in made.values():
        raw.append((await client.beta.agents.vaults.credentials.with_raw_response.retrieve(credential.id, vault_id=vault.id)).text)
    raw.append((await client.beta.agents.vaults.credentials.with_raw_response.list(vault.id)).text)
    assert_no_secret("".join(raw))
    assert_no_secret(await stored_rows(api))
    assert await secrets_of(api, static.id) == {"token": TOKEN}
    assert await secrets_of(api, oauth.id) == {"access_token": ACCESS, "refresh_token": REFRESH, "client_secret": CLIENT_SECRET}
    assert await secrets_of(api, variable.id) == {"secret_value": VALUE}


async def test_rotation_replaces_the_secret_under_a_new_data_key_and_shreds_the_old_one(api: Api) -> None:
    client = await api.official()
    vault = await client.beta.agents.vaults.create()
    credential = await client.beta.agents.vaults.credentials.create(vault.id, name="deploy", auth=STATIC)  # type: ignore[arg-type]
    async with api.engine.runtime.db.read() as conn:
        before = set((await conn.execute(sa.select(data_keys.c.id))).scalars())
    rotated = await client.beta.agents.vaults.credentials.update(
        credential.id, vault_id=vault.id, auth={"type": "static_bearer", "token": "tok-rotated-0123456789"}
    )
    assert rotated.auth.model_dump() == credential.auth.model_dump() and rotated.updated_at >= credential.updated_at
    assert await secrets_of(api, credential.id) == {"token": "tok-rotated-0123456789"}
    async with api.engine.runtime.db.read() as conn:
        after = set((await conn.execute(sa.select(data_keys.c.id))).scalars())
    assert len(after) == 1 and not after & before
    tagged = await client.beta.agents.vaults.credentials.update(credential.id, vault_id=vault.id, metadata={"env": "prod"})
    assert tagged.metadata == {"env": "prod"} and await secrets_of(api, credential.id) == {"token": "tok-rotated-0123456789"}


async def test_an_oauth_rotation_follows_the_rules_of_the_spec(api: Api) -> None:
    client = await api.official()
    vault = await client.beta.agents.vaults.create()
    credentials_api = client.beta.agents.vaults.credentials
    oauth = await credentials_api.create(vault.id, name="oauth", auth=OAUTH)  # type: ignore[arg-type]
    # A new access token without an expiry clears the old expiry; the refresh token stays.
    fresh = await credentials_api.update(oauth.id, vault_id=vault.id, auth={"type": "mcp_oauth", "access_token": "oauth-new-0123456789"})
    assert fresh.auth.expires_at is None  # type: ignore[union-attr]
    assert await secrets_of(api, oauth.id) == {"access_token": "oauth-new-0123456789", "refresh_token": REFRESH,
                                              "client_secret": CLIENT_SECRET}
    dated = await credentials_api.update(oauth.id, vault_id=vault.id, auth={"type": "mcp_oauth", "expires_at": "2031-05-01T10:00:00+02:00"})
    assert dated.auth.expires_at == "2031-05-01T10:00:00+02:00"  # type: ignore[union-attr]
    scoped = await credentials_api.update(oauth.id, vault_id=vault.id, auth={
        "type": "mcp_oauth", "refresh": {"scope": None, "token_endpoint_auth": {"type": "client_secret_post", "client_secret": "client-new-0123456789"}},
    })
    assert scoped.auth.refresh is not None and scoped.auth.refresh.scope is None  # type: ignore[union-attr]
    assert (await secrets_of(api, oauth.id))["client_secret"] == "client-new-0123456789"
    refused = [
        {"type": "static_bearer", "token": "tok-other-0123456789"},
        {"type": "mcp_oauth", "refresh": {"token_endpoint_auth": {"type": "client_secret_basic", "client_secret": "x" * 12}}},
    ]
    bare = await credentials_api.create(vault.id, name="bare", auth={**OAUTH, "refresh": None})  # type: ignore[arg-type]
    for auth, target in ((refused[0], oauth.id), (refused[1], oauth.id), ({"type": "mcp_oauth", "refresh": {"refresh_token": "r" * 12}}, bare.id)):
        with pytest.raises(openai.BadRequestError) as caught:
            await credentials_api.update(target, vault_id=vault.id, auth=auth)  # type: ignore[arg-type]
        assert "auth" in str(caught.value.param)
    assert (await secrets_of(api, oauth.id))["client_secret"] == "client-new-0123456789"


@pytest.mark.parametrize(
    ("auth", "param"),
    [
        ({**VARIABLE, "secret_value": VALUE + "\nsecond line"}, "auth.environment_variable.secret_value"),
        ({**STATIC, "token": "short"}, "auth.static_bearer.token"),
        ({**STATIC, "mcp_server_url": "http://mcp.example.com/"}, "auth.static_bearer.mcp_server_url"),
        ({**STATIC, "mcp_server_url": f"https://user:{TOKEN}@mcp.example.com/"}, "auth.static_bearer.mcp_server_url"),
        ({**STATIC, "extra": TOKEN}, "auth.static_bearer.extra"),
        ({**VARIABLE, "secret_name": "CODEX_TOKEN"}, "auth.environment_variable.secret_name"),
        ({**VARIABLE, "secret_name": "PATH"}, "auth.environment_variable.secret_name"),
        ({**VARIABLE, "networking": {"type": "limited", "allowed_hosts": ["https://api.example.com"]}},
         "auth.environment_variable.networking.limited.allowed_hosts"),
        ({**VARIABLE, "networking": {"type": "limited", "allowed_hosts": ["*.example.com"]}},
         "auth.environment_variable.networking.limited.allowed_hosts"),
        ({**VARIABLE, "networking": {"type": "limited", "allowed_hosts": ["::1"]}},
         "auth.environment_variable.networking.limited.allowed_hosts"),
        ({**OAUTH, "expires_at": "tomorrow"}, "auth.mcp_oauth.expires_at"),
    ],
)
async def test_a_refused_credential_names_the_field_never_the_value_and_stores_nothing(
    api: Api, auth: dict[str, Any], param: str
) -> None:
    client = await api.official()
    vault = await client.beta.agents.vaults.create()
    with pytest.raises(openai.BadRequestError) as caught:
        await client.beta.agents.vaults.credentials.create(vault.id, name="bad", auth=auth)  # type: ignore[arg-type]
    assert caught.value.param == param
    assert_no_secret(json.dumps(caught.value.body))
    assert [c async for c in client.beta.agents.vaults.credentials.list(vault.id)] == []


async def test_a_name_is_used_once_per_vault(api: Api) -> None:
    client = await api.official()
    first, second = await client.beta.agents.vaults.create(), await client.beta.agents.vaults.create()
    await client.beta.agents.vaults.credentials.create(first.id, name="deploy", auth=STATIC)  # type: ignore[arg-type]
    with pytest.raises(openai.ConflictError) as caught:
        await client.beta.agents.vaults.credentials.create(first.id, name=" deploy ", auth=STATIC)  # type: ignore[arg-type]
    assert caught.value.code == "credential_name_taken"
    await client.beta.agents.vaults.credentials.create(second.id, name="deploy", auth=STATIC)  # type: ignore[arg-type]


async def test_deleting_a_vault_deletes_its_credentials_and_shreds_their_keys(api: Api) -> None:
    client = await api.official()
    doomed, kept = await client.beta.agents.vaults.create(), await client.beta.agents.vaults.create()
    for name, auth in (("a", STATIC), ("b", VARIABLE)):
        await client.beta.agents.vaults.credentials.create(doomed.id, name=name, auth=auth)  # type: ignore[arg-type]
    survivor = await client.beta.agents.vaults.credentials.create(kept.id, name="c", auth=OAUTH)  # type: ignore[arg-type]
    gone = await client.beta.agents.vaults.credentials.create(kept.id, name="d", auth=STATIC)  # type: ignore[arg-type]
    deleted = await client.beta.agents.vaults.credentials.delete(gone.id, vault_id=kept.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (gone.id, "vault.credential.deleted", True)
    await client.beta.agents.vaults.delete(doomed.id)
    async with api.engine.runtime.db.read() as conn:
        owners = sorted((await conn.execute(sa.select(data_keys.c.record_id))).scalars())
        left = sorted((await conn.execute(sa.select(credentials.c.id))).scalars())
    assert owners == left == [survivor.id]
    with pytest.raises(openai.NotFoundError):
        await client.beta.agents.vaults.credentials.retrieve(gone.id, vault_id=kept.id)


async def test_another_tenant_sees_no_vault_and_changes_nothing(api: Api) -> None:
    mine = await api.official()
    vault = await mine.beta.agents.vaults.create(name="mine")
    credential = await mine.beta.agents.vaults.credentials.create(vault.id, name="deploy", auth=STATIC)  # type: ignore[arg-type]
    theirs = await api.official(tenant="t2")
    assert [v async for v in theirs.beta.agents.vaults.list()] == []
    attempts = [
        theirs.beta.agents.vaults.retrieve(vault.id),
        theirs.beta.agents.vaults.update(vault.id, name="taken"),
        theirs.beta.agents.vaults.delete(vault.id),
        theirs.beta.agents.vaults.credentials.retrieve(credential.id, vault_id=vault.id),
        theirs.beta.agents.vaults.credentials.update(credential.id, vault_id=vault.id, auth={"type": "static_bearer", "token": "x" * 20}),
        theirs.beta.agents.vaults.credentials.delete(credential.id, vault_id=vault.id),
        theirs.beta.agents.vaults.credentials.create(vault.id, name="x", auth=STATIC),  # type: ignore[arg-type]
    ]
    for attempt in attempts:
        with pytest.raises(openai.NotFoundError):
            await attempt
    assert (await mine.beta.agents.vaults.retrieve(vault.id)).name == "mine"
    assert await secrets_of(api, credential.id) == {"token": TOKEN}


async def test_only_an_admin_key_manages_vaults_and_any_key_reads_them(api: Api) -> None:
    vault = await (await api.official()).beta.agents.vaults.create(name="v")
    for role in ("member", "reader", "approver"):
        client = await api.official(role=role)
        assert (await client.beta.agents.vaults.retrieve(vault.id)).name == "v"
        with pytest.raises(openai.PermissionDeniedError):
            await client.beta.agents.vaults.create(name="nope")
        with pytest.raises(openai.PermissionDeniedError):
            await client.beta.agents.vaults.credentials.create(vault.id, name="x", auth=STATIC)  # type: ignore[arg-type]
        with pytest.raises(openai.PermissionDeniedError):
            await client.beta.agents.vaults.delete(vault.id)
    assert len([v async for v in (await api.official()).beta.agents.vaults.list()]) == 1


async def test_a_session_names_its_tenants_vaults_and_only_those(api: Api) -> None:
    admin = await api.official()
    first, second = await admin.beta.agents.vaults.create(), await admin.beta.agents.vaults.create()
    foreign = await (await api.official(tenant="t2")).beta.agents.vaults.create()
    api.engine.script([{"say": "hello"}])
    client = await api.official(role="member")
    environment: Any = {"type": "openai_hosted"}
    session = await client.beta.agents.sessions.create(agent={"model": "scripted:test"}, environment=environment,
                                                       vault_ids=[second.id, first.id])
    assert session.vault_ids == [second.id, first.id]
    assert (await client.beta.agents.sessions.retrieve(session.id)).vault_ids == [second.id, first.id]
    for vault_ids in ([foreign.id], ["vault_unknown"], [first.id, first.id]):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.beta.agents.sessions.create(agent={"model": "scripted:test"}, environment=environment, vault_ids=vault_ids)
        assert caught.value.param == "vault_ids"
    assert len([s async for s in client.beta.agents.sessions.list()]) == 1
