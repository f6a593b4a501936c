"""The credentials an operator tool receives: `ctx.credentials["deploy-token"]`.

At each execution of a turn (its first run or a resume, on whichever worker) the credentials
of the session's vaults are decrypted in memory and handed to the operator's tools by
credential name, as one of three typed objects, one per `auth` type of the Agents API:

- `StaticBearer`: `token`, for `mcp_server_url`;
- `McpOAuth`: `access_token` (and its `expires_at`), for `mcp_server_url`;
- `EnvironmentVariable`: `value`, the real secret; sandboxed code sees only `placeholder` in
  the variable `env_name` (docs/security.md).

None of them is ever stored or sent anywhere: their `repr` names no secret, and they refuse to
be pickled, copied into another process or encoded as JSON, like `RuntimeDeps`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import NoReturn

__all__ = ["Credential", "Credentials", "EnvironmentVariable", "McpOAuth", "StaticBearer"]


class _Unserializable:
    __slots__ = ()

    def __reduce__(self) -> NoReturn:
        raise TypeError("credentials are never serialized: each execution decrypts its own (docs/security.md)")


@dataclass(frozen=True, slots=True, repr=False)
class StaticBearer(_Unserializable):
    name: str
    credential_id: str
    mcp_server_url: str
    token: str

    def __repr__(self) -> str:
        return f"StaticBearer({self.name!r}, {self.credential_id}, token=…)"


@dataclass(frozen=True, slots=True, repr=False)
class McpOAuth(_Unserializable):
    name: str
    credential_id: str
    mcp_server_url: str
    access_token: str
    # Unix seconds; None when unknown.
    expires_at: int | None

    def __repr__(self) -> str:
        return f"McpOAuth({self.name!r}, {self.credential_id}, access_token=…)"


@dataclass(frozen=True, slots=True, repr=False)
class EnvironmentVariable(_Unserializable):
    name: str
    credential_id: str
    # The sandbox variable that holds `placeholder`.
    env_name: str
    value: str
    placeholder: str

    def __repr__(self) -> str:
        return f"EnvironmentVariable({self.name!r}, {self.credential_id}, env_name={self.env_name!r}, value=…)"


Credential = StaticBearer | McpOAuth | EnvironmentVariable


class Credentials(Mapping[str, Credential], _Unserializable):
    """A read-only mapping of credential names to the session's credentials."""

    __slots__ = ("_by_name",)
    _by_name: dict[str, Credential]

    def __init__(self, credentials: Mapping[str, Credential] | None = None) -> None:
        object.__setattr__(self, "_by_name", dict(credentials or {}))

    def __getitem__(self, name: str) -> Credential:
        try:
            return self._by_name[name]
        except KeyError:
            have = ", ".join(sorted(self._by_name)) or "none: the session names no vault with credentials"
            raise KeyError(f"no credential {name!r} in this session's vaults (there are: {have})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("credentials are read-only")

    def __repr__(self) -> str:
        return f"Credentials({', '.join(sorted(self._by_name))})"
