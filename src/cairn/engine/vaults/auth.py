"""A credential's `auth`, split into what may be shown and what never is (spec §2.5, §3.9).

A credential is created with its type, its settings and its secret values together; from then
on they live apart: the settings (`mcp_server_url`, `secret_name`, `networking`, the refresh
settings…) in the credential's row as the API shows them, the secret values (`token`,
`access_token`, `refresh_token`, `client_secret`, `secret_value`) only sealed. Rotating changes
secret values (and an OAuth token's expiry or scope) under the rules of spec §2.5: the type
must match, and the URL, the variable's name and the networking never change.

The input here has been validated by the API's request models (`cairn.api.schemas`); these
functions only rearrange it and check what needs the stored credential.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cairn.errors import InvalidRequestError

__all__ = ["CredentialAuth", "SECRET_FIELDS", "rotated_auth", "split_auth"]

# The secret values of each type, as they are sealed (a mapping of these names to strings).
SECRET_FIELDS = {
    "static_bearer": ("token",),
    "mcp_oauth": ("access_token", "refresh_token", "client_secret"),
    "environment_variable": ("secret_value",),
}


@dataclass(frozen=True, slots=True)
class CredentialAuth:
    """A credential's `auth` as the API shows it, and its secret values."""

    public: dict[str, Any]
    secret: dict[str, str]

    @property
    def type(self) -> str:
        return str(self.public["type"])


def split_auth(auth: Mapping[str, Any]) -> CredentialAuth:
    """A create body's `auth` as it is stored."""
    kind = auth["type"]
    if kind == "static_bearer":
        return CredentialAuth({"type": kind, "mcp_server_url": auth["mcp_server_url"]}, {"token": auth["token"]})
    if kind == "environment_variable":
        variable = {"type": kind, "secret_name": auth["secret_name"], "networking": dict(auth["networking"])}
        return CredentialAuth(variable, {"secret_value": auth["secret_value"]})
    secret = {"access_token": auth["access_token"]}
    public: dict[str, Any] = {"type": kind, "mcp_server_url": auth["mcp_server_url"], "expires_at": auth.get("expires_at"),
                              "refresh": None}
    refresh = auth.get("refresh")
    if refresh is not None:
        endpoint_auth = refresh["token_endpoint_auth"]
        public["refresh"] = {
            "client_id": refresh["client_id"],
            "token_endpoint": refresh["token_endpoint"],
            "token_endpoint_auth": {"type": endpoint_auth["type"]},
            "resource": refresh.get("resource"),
            "scope": refresh.get("scope"),
        }
        secret["refresh_token"] = refresh["refresh_token"]
        if endpoint_auth["type"] != "none":
            secret["client_secret"] = endpoint_auth["client_secret"]
    return CredentialAuth(public, secret)


def rotated_auth(stored: CredentialAuth, rotation: Mapping[str, Any]) -> CredentialAuth:
    """`stored` after a rotate body's `auth` (only the keys the caller sent are in `rotation`;
    an explicit null is kept, it means "clear" or "keep" depending on the field)."""
    if rotation["type"] != stored.type:
        raise InvalidRequestError(
            f"auth.type must be {stored.type!r}, the credential's type: a credential's type cannot change (create a new one)",
            param="auth.type",
        )
    public, secret = dict(stored.public), dict(stored.secret)
    if stored.type == "static_bearer":
        secret["token"] = rotation["token"]
    elif stored.type == "environment_variable":
        secret["secret_value"] = rotation["secret_value"]
    else:
        _rotate_oauth(public, secret, rotation)
    return CredentialAuth(public, secret)


def _rotate_oauth(public: dict[str, Any], secret: dict[str, str], rotation: Mapping[str, Any]) -> None:
    if rotation.get("access_token") is not None:
        secret["access_token"] = rotation["access_token"]
        # A new access token without an expiry has none known (spec §2.5).
        public["expires_at"] = rotation.get("expires_at")
    elif "expires_at" in rotation:
        public["expires_at"] = rotation["expires_at"]
    refresh = rotation.get("refresh")
    if refresh is None:
        return
    if public["refresh"] is None:
        raise InvalidRequestError(
            "auth.refresh: this credential has no refresh settings to update (create a credential with them)",
            param="auth.refresh",
        )
    settings = dict(public["refresh"])
    if refresh.get("refresh_token") is not None:
        secret["refresh_token"] = refresh["refresh_token"]
    if "scope" in refresh:
        settings["scope"] = refresh["scope"]
    endpoint_auth = refresh.get("token_endpoint_auth")
    if endpoint_auth is not None:
        if endpoint_auth["type"] != settings["token_endpoint_auth"]["type"]:
            raise InvalidRequestError(
                f"auth.refresh.token_endpoint_auth.type must be {settings['token_endpoint_auth']['type']!r}, the "
                "credential's: only its client secret can be rotated",
                param="auth.refresh.token_endpoint_auth.type",
            )
        if endpoint_auth.get("client_secret") is not None:
            secret["client_secret"] = endpoint_auth["client_secret"]
    public["refresh"] = settings
