"""A session's `environment_variable` credentials as the egress proxy uses them.

Sandbox code sees a placeholder in the credential's variable; the proxy puts the secret in
its place on the wire, only in HTTPS requests to a host the credential is allowed for
(`WireSecret.allowed_hosts`, or for an unrestricted credential the session's restricted
`allowed_domains`). `WireSecret` is the one both sides use (notes/secrets-egress-contract.md; the secrets
runtime in the engine imports it from here, the layer below it): the worker hands the
proxy those of a session when it runs the session's commands, and the proxy keeps them in
memory only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cairn.sandbox.egress.policy import NetworkPolicy, host_matches, normalize_host, parse_domain_patterns

__all__ = ["SessionEgress", "WireSecret"]


@dataclass(frozen=True, slots=True)
class WireSecret:
    """One environment_variable credential of a session, as the egress proxy needs it."""

    credential_id: str
    env_name: str  # the sandbox variable that holds the placeholder
    placeholder: str  # what sandbox code sees; holds nothing of the secret
    value: str = field(repr=False)  # the real secret, in memory only
    allowed_hosts: tuple[str, ...] | None  # None: unrestricted (then the session's allowed_domains)

    def __reduce__(self) -> Any:
        raise TypeError("a wire secret is never serialized")


@dataclass(frozen=True, slots=True)
class SessionEgress:
    """What the proxy knows of one session: its policy and its credentials.

    Each credential's hosts are parsed once, here: a malformed `allowed_hosts` entry is an
    `InvalidRequestError` when the session's command starts, not a failure per connection.
    """

    session_id: str
    policy: NetworkPolicy
    secrets: Sequence[WireSecret] = ()
    _hosts: tuple[tuple[str, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hosts", tuple(self._hosts_of(secret) for secret in self.secrets))

    def secrets_for(self, host: str) -> tuple[WireSecret, ...]:
        """The credentials allowed for `host` (normalized): the ones substituted there."""
        host = normalize_host(host)
        return tuple(secret for secret, hosts in zip(self.secrets, self._hosts) if host_matches(host, hosts))

    def _hosts_of(self, secret: WireSecret) -> tuple[str, ...]:
        if secret.allowed_hosts is not None:
            return parse_domain_patterns(secret.allowed_hosts, param=f"credential {secret.credential_id} allowed_hosts")
        if self.policy.access == "restricted":
            return self.policy.allowed_domains
        return ()
