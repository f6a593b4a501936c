"""A session's credentials, decrypted in memory for one execution of its turn (design invariant 6).

At each execution (a turn's first run, or its resume after a pause, on whichever worker) the
worker calls `load_session_secrets`: the credentials of the session's vaults are opened with
the deployment's master keys and handed over, never written anywhere:

- to operator tools, by credential name (`ToolContext.credentials`, typed objects of
  `cairn.operator.credentials`);
- to the sandbox, only as placeholders: an `environment_variable` credential puts a
  placeholder into its variable, never the value (`SessionSecrets.env`);
- to the egress proxy, which swaps a placeholder for the value in requests to the
  credential's allowed hosts (`SessionSecrets.wire`; the contract with issue 18 is
  docs/security.md);
- to redaction: every value is replaced by a marker in whatever the execution stores
  (`SessionSecrets.known_values`).

What a run stores names credentials by id (the session's `vault_ids`), never by value.

A placeholder is an HMAC of the session, the credential and the version of its value (the id
of the data key its secret is sealed under, new at each rotation), keyed by the deployment's
digest key: the same on every worker for the same value, different per session and after a
rotation, and nothing about the secret can be learnt from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cairn._concurrency import run_sync
from cairn.durable.crypto import blob_key_id
from cairn.durable.sealing import Sealer
from cairn.engine.approvals.digest import ApprovalKey
from cairn.engine.runtime import Runtime
from cairn.engine.vaults.service import credential_scope
from cairn.errors import InvalidRequestError
from cairn.operator.credentials import Credential, Credentials, EnvironmentVariable, McpOAuth, StaticBearer
from cairn.redaction import MIN_SECRET_CHARS, KnownValues
from cairn.sandbox.egress import WireSecret  # the egress proxy's, one layer down
from cairn.store.db import Connection
from cairn.store.sessions import SessionRecord
from cairn.store.vaults import CredentialRecord, credentials_of_vaults

__all__ = [
    "OpenedCredential",
    "SessionSecrets",
    "WireSecret",
    "check_session_env",
    "load_session_secrets",
    "no_secrets",
    "open_credentials",
]

_PLACEHOLDER_PREFIX = "cairn-placeholder-"


@dataclass(frozen=True, slots=True)
class SessionSecrets:
    """What one execution of a session's turn gets of its vaults' credentials."""

    env: Mapping[str, str]  # env_name -> placeholder, merged into the sandbox's environment
    wire: Sequence[WireSecret]
    tool_credentials: Credentials  # by credential name, for ToolContext (operator tools)
    known_values: KnownValues  # what redaction must replace (the operator may add more)

    def __reduce__(self) -> Any:
        raise TypeError("a session's secrets are never serialized")


def no_secrets() -> SessionSecrets:
    """The secrets of an execution without vaults (a fresh, empty set of known values)."""
    return SessionSecrets(env={}, wire=(), tool_credentials=Credentials(), known_values=KnownValues())


@dataclass(frozen=True, slots=True)
class OpenedCredential:
    """A credential row and its secret values, decrypted."""

    record: CredentialRecord
    secret: Mapping[str, str] = field(repr=False)

    def secret_values(self) -> list[str]:
        # The API refuses shorter values; a shorter one could not be redacted reliably anyway.
        return [v for v in self.secret.values() if isinstance(v, str) and len(v) >= MIN_SECRET_CHARS]


def _known_values(credentials: Iterable[OpenedCredential]) -> KnownValues:
    return KnownValues(v for c in credentials for v in c.secret_values())


async def open_credentials(conn: Connection, sealer: Sealer, tenant: str, vault_ids: Sequence[str]) -> list[OpenedCredential]:
    """Every credential of these vaults of `tenant`, decrypted, vault by vault in the order given.
    A secret that cannot be opened is a `StateDeserializeError`."""
    records = await credentials_of_vaults(conn, vault_ids, tenant=tenant)
    order = {vault_id: i for i, vault_id in enumerate(dict.fromkeys(vault_ids))}
    records.sort(key=lambda r: order[r.vault_id])  # stable: by creation within a vault
    return [OpenedCredential(r, await sealer.open_json(conn, r.secret, credential_scope(r))) for r in records]


async def load_session_secrets(rt: Runtime, session: SessionRecord) -> SessionSecrets:
    """Decrypt the credentials of `session`'s vaults for this execution (in memory only).

    Where two vaults of the session have a credential of the same name, or two credentials fill
    the same variable, the first vault in `vault_ids` wins. Raises `StateDeserializeError` when a
    secret cannot be opened (another master key, a tampered row)."""
    if not session.vault_ids:
        return no_secrets()
    async with rt.db.read() as conn:
        opened = await open_credentials(conn, rt.sealer, session.tenant, session.vault_ids)
    key = await run_sync(ApprovalKey.of, rt.settings) if any(c.record.type == "environment_variable" for c in opened) else None
    by_name: dict[str, Credential] = {}
    env: dict[str, str] = {}
    wire: list[WireSecret] = []
    for credential in opened:
        made = _credential(credential, session, key)
        by_name.setdefault(credential.record.name, made)
        if isinstance(made, EnvironmentVariable) and made.env_name not in env:
            env[made.env_name] = made.placeholder
            wire.append(WireSecret(made.credential_id, made.env_name, made.placeholder, made.value,
                                   _allowed_hosts(credential.record.auth)))
    return SessionSecrets(env=env, wire=tuple(wire), tool_credentials=Credentials(by_name), known_values=_known_values(opened))


def _credential(opened: OpenedCredential, session: SessionRecord, key: ApprovalKey | None) -> Credential:
    record, secret, auth = opened.record, opened.secret, opened.record.auth
    if record.type == "static_bearer":
        return StaticBearer(record.name, record.id, auth["mcp_server_url"], secret["token"])
    if record.type == "mcp_oauth":
        return McpOAuth(record.name, record.id, auth["mcp_server_url"], secret["access_token"], auth.get("expires_at"))
    assert key is not None
    version = blob_key_id(record.secret)
    digest = key.digest({"purpose": "credential placeholder", "session_id": session.id, "credential_id": record.id,
                         "value_version": version})
    return EnvironmentVariable(record.name, record.id, auth["secret_name"], secret["secret_value"],
                               _PLACEHOLDER_PREFIX + digest[:40])


def _allowed_hosts(auth: Mapping[str, Any]) -> tuple[str, ...] | None:
    networking = auth.get("networking") or {}
    return tuple(networking["allowed_hosts"]) if networking.get("type") == "limited" else None


def check_session_env(env: Mapping[str, str], credentials: Iterable[OpenedCredential]) -> None:
    """Refuse a session `environment.env` that holds the value of one of its vaults' credentials:
    secrets belong in vaults, where the sandbox gets a placeholder (docs/security.md)."""
    known = _known_values(credentials)
    for name, value in env.items():
        if known.redactor.finds(value):
            raise InvalidRequestError(
                f"environment.env.{name} holds the value of a credential of the session's vaults: secrets belong in a "
                "vault (an environment_variable credential gives the sandbox a placeholder, never the value)",
                param=f"environment.env.{name}",
            )
