"""The operator's egress settings, read once from CAIRN_EGRESS_* variables.

- `CAIRN_EGRESS_ALLOW_PRIVATE`: comma-separated host names (or `*.suffix` patterns) the
  proxy may connect to even though they resolve to private, loopback or host addresses (a
  company registry, a test server); the session's policy still applies to them.
- `CAIRN_EGRESS_MAX_CONNECTIONS`: open connections per session (default 64); one more is
  refused with 429.
- `CAIRN_EGRESS_BANDWIDTH_BYTES_S`: bytes per second per session, both directions
  together (default: unlimited).
- `CAIRN_EGRESS_INTERCEPT_PORTS`: the ports on which HTTPS to a host with credentials is
  intercepted to substitute them (default `443,8443`).
- `CAIRN_EGRESS_HOSTS` (tests): `name=address,...`, answers the proxy's name resolution
  with these addresses instead of DNS for the names given.
- `CAIRN_EGRESS_UPSTREAM_CA` (tests): a PEM file of extra CAs the proxy trusts when it
  re-encrypts an intercepted connection to the real host.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cairn.errors import InvalidRequestError
from cairn.sandbox.egress.policy import normalize_host

__all__ = ["EgressSettings"]


DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_INTERCEPT_PORTS = (443, 8443)


@dataclass(frozen=True, slots=True)
class EgressSettings:
    allow_private: frozenset[str] = frozenset()
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    bandwidth_bytes_s: int | None = None
    intercept_ports: tuple[int, ...] = DEFAULT_INTERCEPT_PORTS
    hosts: Mapping[str, str] = field(default_factory=dict)
    upstream_ca: Path | None = None

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise InvalidRequestError("CAIRN_EGRESS_MAX_CONNECTIONS must be 1 or more", param="CAIRN_EGRESS_MAX_CONNECTIONS")
        if self.bandwidth_bytes_s is not None and self.bandwidth_bytes_s < 1024:
            raise InvalidRequestError(
                "CAIRN_EGRESS_BANDWIDTH_BYTES_S must be 1024 or more", param="CAIRN_EGRESS_BANDWIDTH_BYTES_S"
            )
        for name, address in self.hosts.items():
            try:
                ipaddress.ip_address(address)
            except ValueError as exc:
                raise InvalidRequestError(
                    f"CAIRN_EGRESS_HOSTS: {name}={address} is not an IP address", param="CAIRN_EGRESS_HOSTS"
                ) from exc

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> EgressSettings:
        def names(value: str) -> list[str]:
            return [normalize_host(part) for part in value.split(",") if part.strip()]

        hosts: dict[str, str] = {}
        for entry in environ.get("CAIRN_EGRESS_HOSTS", "").split(","):
            if not entry.strip():
                continue
            name, sep, address = entry.partition("=")
            if not sep:
                raise InvalidRequestError(f"CAIRN_EGRESS_HOSTS: {entry!r} is not name=address", param="CAIRN_EGRESS_HOSTS")
            hosts[normalize_host(name)] = address.strip()
        ports = environ.get("CAIRN_EGRESS_INTERCEPT_PORTS")
        try:
            bandwidth = environ.get("CAIRN_EGRESS_BANDWIDTH_BYTES_S")
            return cls(
                allow_private=frozenset(names(environ.get("CAIRN_EGRESS_ALLOW_PRIVATE", ""))),
                max_connections=int(environ.get("CAIRN_EGRESS_MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS)),
                bandwidth_bytes_s=int(bandwidth) if bandwidth else None,
                intercept_ports=tuple(int(port) for port in ports.split(",")) if ports else DEFAULT_INTERCEPT_PORTS,
                hosts=hosts,
                upstream_ca=Path(environ["CAIRN_EGRESS_UPSTREAM_CA"]) if environ.get("CAIRN_EGRESS_UPSTREAM_CA") else None,
            )
        except ValueError as exc:
            raise InvalidRequestError(f"an egress setting is not a number: {exc}", param="CAIRN_EGRESS") from exc
