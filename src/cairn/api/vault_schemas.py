"""Request bodies of `/v1/vaults` (spec §2.5) as strict pydantic models.

Secret values are write-only: no error message here (or anywhere a body is refused) shows a
value, only the field that is wrong and why. A secret must be long enough to be told apart
from ordinary text, because every value stored is also what redaction looks for in a turn's
output (`cairn.redaction`): a three-letter "token" would blank out every word containing it.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, field_validator

from cairn.api.schemas import Metadata, Name, StrictBody, check_metadata
from cairn.api.text import describe_control
from cairn.redaction import MIN_SECRET_CHARS

__all__ = [
    "CreateCredentialBody",
    "CreateVaultBody",
    "UpdateCredentialBody",
    "UpdateVaultBody",
]

_MAX_SECRET_CHARS = 16 * 1024
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Set by the sandbox for every command, or kept for the egress proxy and its certificates.
_RESERVED_VARIABLES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM", "TMPDIR", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
    }
)
_HOSTNAME = re.compile(r"(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")
_LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def _trimmed_name(value: str) -> str:
    trimmed = value.strip()
    if not 1 <= len(trimmed.encode()) <= 256:
        raise ValueError("must hold 1 to 256 UTF-8 bytes after trimming")
    problem = describe_control(trimmed)
    if problem is not None:
        raise ValueError(f"must not contain a {problem}")
    return trimmed


def _secret(value: str) -> str:
    if len(value) < MIN_SECRET_CHARS:
        raise ValueError(f"must be at least {MIN_SECRET_CHARS} characters (shorter values cannot be redacted reliably)")
    if len(value) > _MAX_SECRET_CHARS:
        raise ValueError(f"must be at most {_MAX_SECRET_CHARS} characters")
    if "\x00" in value:
        raise ValueError("must not contain NUL")
    return value


def _one_line_secret(value: str) -> str:
    if "\r" in value or "\n" in value:
        raise ValueError("must not contain carriage returns or newlines")
    return _secret(value)


def _https_url(value: str) -> str:
    """An HTTPS URL; plain HTTP only to this machine (a local MCP server in development)."""
    if len(value) > 2048 or describe_control(value) is not None or " " in value:
        raise ValueError("must be an https:// URL of at most 2048 characters, without spaces or control characters")
    parts = urlsplit(value)
    if not parts.hostname or parts.scheme not in ("https", "http") or (
        parts.scheme == "http" and parts.hostname not in _LOOPBACK_HOSTS
    ):
        raise ValueError("must be an https:// URL (http:// only for localhost)")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials in the URL (put them in the credential's secret fields)")
    return value


def _rfc3339(value: str) -> str:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("must be an RFC 3339 timestamp, e.g. 2026-12-31T23:59:59Z") from None
    if "T" not in value.upper() or parsed.tzinfo is None:
        raise ValueError("must be an RFC 3339 timestamp with a time and an offset, e.g. 2026-12-31T23:59:59Z")
    return value


def _variable_name(value: str) -> str:
    if not _VARIABLE.fullmatch(value):
        raise ValueError("must be 1-128 ASCII letters, digits and underscores, not starting with a digit")
    if value.upper().startswith(("CODEX_", "CAIRN_")) or value.upper() in _RESERVED_VARIABLES:
        raise ValueError("is reserved (CODEX_* and CAIRN_* names, the proxy and certificate variables, and the variables "
                         "every sandboxed command gets are not available)")
    return value


def _host(value: str) -> str:
    host = value.strip().lower()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        if address.version != 4:
            raise ValueError("IPv6 addresses are not supported")
        return host
    if not _HOSTNAME.fullmatch(host):
        raise ValueError("each entry must be a hostname or an IPv4 address: no scheme, path, port or wildcard")
    return host


TrimmedName = Annotated[str, AfterValidator(_trimmed_name)]
Secret = Annotated[str, AfterValidator(_secret)]
OneLineSecret = Annotated[str, AfterValidator(_one_line_secret)]
HttpsUrl = Annotated[str, AfterValidator(_https_url)]
Timestamp = Annotated[str, AfterValidator(_rfc3339)]
Setting = Annotated[Name, Field(min_length=1, max_length=1024)]


# -- vaults -------------------------------------------------------------------------------


class CreateVaultBody(StrictBody):
    name: TrimmedName | None = None
    metadata: Metadata | None = None

    _metadata = field_validator("metadata")(check_metadata)


class UpdateVaultBody(StrictBody):
    # Absent: unchanged; null: cleared.
    name: TrimmedName | None = None
    # Replaces all metadata; {} clears it.
    metadata: Metadata | None = None

    _metadata = field_validator("metadata")(check_metadata)

    @field_validator("metadata")
    @classmethod
    def _not_null(cls, value: Metadata | None) -> Metadata:
        if value is None:
            raise ValueError("must be an object (send {} to clear the metadata)")
        return value


# -- credentials: creation ----------------------------------------------------------------


class NoClientSecret(StrictBody):
    type: Literal["none"]


class ClientSecret(StrictBody):
    type: Literal["client_secret_basic", "client_secret_post"]
    client_secret: Secret


class OauthRefresh(StrictBody):
    client_id: Setting
    refresh_token: Secret
    token_endpoint: HttpsUrl
    token_endpoint_auth: Annotated[NoClientSecret | ClientSecret, Field(discriminator="type")]
    resource: Setting | None = None
    scope: Setting | None = None


class McpOauthAuth(StrictBody):
    type: Literal["mcp_oauth"]
    access_token: Secret
    mcp_server_url: HttpsUrl
    expires_at: Timestamp | None = None
    refresh: OauthRefresh | None = None


class StaticBearerAuth(StrictBody):
    type: Literal["static_bearer"]
    token: Secret
    mcp_server_url: HttpsUrl


class Unrestricted(StrictBody):
    type: Literal["unrestricted"]


class Limited(StrictBody):
    type: Literal["limited"]
    allowed_hosts: list[str] = Field(min_length=1, max_length=16)

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        hosts = [_host(h) for h in value]
        if len(set(hosts)) != len(hosts):
            raise ValueError("allowed_hosts must be distinct (after lowercasing)")
        return hosts


class EnvironmentVariableAuth(StrictBody):
    type: Literal["environment_variable"]
    secret_name: Annotated[str, AfterValidator(_variable_name)]
    secret_value: OneLineSecret
    networking: Annotated[Unrestricted | Limited, Field(discriminator="type")]


class CreateCredentialBody(StrictBody):
    name: TrimmedName
    auth: Annotated[McpOauthAuth | StaticBearerAuth | EnvironmentVariableAuth, Field(discriminator="type")]
    metadata: Metadata | None = None

    _metadata = field_validator("metadata")(check_metadata)


# -- credentials: rotation ----------------------------------------------------------------


class RotateClientSecret(StrictBody):
    type: Literal["client_secret_basic", "client_secret_post"]
    # Absent or null: the stored secret stays.
    client_secret: Secret | None = None


class RotateRefresh(StrictBody):
    refresh_token: Secret | None = None
    # Absent: unchanged; null: no scope is sent any more.
    scope: Setting | None = None
    token_endpoint_auth: RotateClientSecret | None = None


class RotateMcpOauth(StrictBody):
    type: Literal["mcp_oauth"]
    access_token: Secret | None = None
    # Absent: unchanged, unless a new access token comes (then cleared); null: cleared.
    expires_at: Timestamp | None = None
    refresh: RotateRefresh | None = None


class RotateStaticBearer(StrictBody):
    type: Literal["static_bearer"]
    token: Secret


class RotateEnvironmentVariable(StrictBody):
    type: Literal["environment_variable"]
    secret_value: OneLineSecret


class UpdateCredentialBody(StrictBody):
    auth: Annotated[RotateMcpOauth | RotateStaticBearer | RotateEnvironmentVariable, Field(discriminator="type")] | None = None
    metadata: Metadata | None = None

    _metadata = field_validator("metadata")(check_metadata)

    @field_validator("auth", "metadata")
    @classmethod
    def _not_null(cls, value: object) -> object:
        if value is None:
            raise ValueError("must be an object when given (leave it out to keep it)")
        return value
