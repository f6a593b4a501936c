"""A session's network policy and the domain patterns it is written in.

`environment.network` of the Agents API: `enabled` lets a sandbox reach any public
destination, `restricted` only the `allowed_domains` minus the `blocked_domains`. A domain
pattern is a host name (`example.com`, matching exactly that host) or a wildcard
(`*.example.com`, matching every host below `example.com` but not `example.com` itself).
Patterns are checked once, when a session is created (`parse_domain_patterns`: a malformed
one is a 400 and nothing is stored), so the proxy only ever matches well-formed ones.
IP literals are refused in patterns: a policy names hosts, and the addresses a name may
reach are the proxy's to check (`addresses.py`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from cairn.errors import InvalidRequestError

__all__ = [
    "MAX_DOMAINS",
    "NetworkPolicy",
    "host_matches",
    "is_host_name",
    "normalize_host",
    "parse_domain_patterns",
]

# More than this many entries in one list is a 400 (each is matched per connection).
MAX_DOMAINS = 256
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
_IPV4 = re.compile(r"\d{1,3}(\.\d{1,3}){3}")

Access = Literal["enabled", "restricted"]


def normalize_host(host: str) -> str:
    """A host name as the policy compares it: lower case, no trailing dot."""
    return host.strip().rstrip(".").lower()


def is_host_name(name: str) -> bool:
    """Whether normalized `name` is a DNS host name (letters, digits, hyphens; no wildcard)."""
    labels = name.split(".")
    return len(name) <= 253 and all(_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit()


def parse_domain_patterns(patterns: Iterable[str], *, param: str) -> tuple[str, ...]:
    """The normalized patterns, or `InvalidRequestError` (a 400 naming `param`) for the
    first that is not a host name or `*.` followed by one."""
    parsed: list[str] = []
    for index, raw in enumerate(patterns):
        where = f"{param}[{index}]"
        if not isinstance(raw, str) or not raw.strip():
            raise InvalidRequestError("a domain must be a non-empty string", param=where)
        pattern = normalize_host(raw)
        if ":" in pattern or "[" in pattern or _IPV4.fullmatch(pattern):
            raise InvalidRequestError(
                f"{raw!r} is an IP address or has a port; domain lists name hosts (example.com, *.example.com)",
                param=where,
            )
        name = pattern[2:] if pattern.startswith("*.") else pattern
        if "*" in name:
            raise InvalidRequestError(
                f"{raw!r}: a wildcard is allowed only as the whole first label (*.example.com)", param=where
            )
        if not is_host_name(name) or (pattern.startswith("*.") and "." not in name):
            raise InvalidRequestError(f"{raw!r} is not a valid domain name", param=where)
        parsed.append(pattern)
    if len(parsed) > MAX_DOMAINS:
        raise InvalidRequestError(f"at most {MAX_DOMAINS} domains per list", param=param)
    return tuple(dict.fromkeys(parsed))


def host_matches(host: str, patterns: Iterable[str]) -> bool:
    """Whether normalized `host` matches one of the (parsed) patterns."""
    for pattern in patterns:
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]):
                return True
        elif host == pattern:
            return True
    return False


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """Where a session's sandbox may connect, beyond the addresses always refused."""

    access: Access
    allowed_domains: tuple[str, ...] = ()
    blocked_domains: tuple[str, ...] = ()

    @classmethod
    def from_environment(cls, network: dict[str, object] | None) -> NetworkPolicy | None:
        """The policy of a stored `environment.network`, None when network is disabled.

        Raises `InvalidRequestError` for lists that do not parse (a session create checks
        them with this too, so a stored one always does)."""
        if not network or network.get("access", "disabled") == "disabled":
            return None
        access = network["access"]
        if access not in ("enabled", "restricted"):
            raise InvalidRequestError(f"unknown network access {access!r}", param="environment.network.access")
        allowed = _pattern_list(network.get("allowed_domains"), "environment.network.allowed_domains")
        blocked = _pattern_list(network.get("blocked_domains"), "environment.network.blocked_domains")
        if access == "enabled" and allowed:
            raise InvalidRequestError(
                "allowed_domains needs access 'restricted' (with 'enabled' every public host is allowed)",
                param="environment.network.allowed_domains",
            )
        if access == "restricted" and not allowed:
            raise InvalidRequestError(
                "network access 'restricted' needs at least one allowed domain",
                param="environment.network.allowed_domains",
            )
        return cls(access=access, allowed_domains=allowed, blocked_domains=blocked)

    def refusal(self, host: str) -> str | None:
        """Why the policy refuses `host` (normalized), or None if it allows it."""
        if host_matches(host, self.blocked_domains):
            return f"{host} is in the session's blocked_domains"
        if self.access == "restricted" and not host_matches(host, self.allowed_domains):
            return f"{host} is not in the session's allowed_domains"
        return None


def _pattern_list(value: object, param: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise InvalidRequestError("a domain list must be an array of strings", param=param)
    return parse_domain_patterns(value, param=param)
