"""Which addresses the egress proxy never connects to, whatever a session's policy says.

Refused: every address that is not globally routable (`ipaddress`'s `is_global` is false
for loopback, link-local 169.254.0.0/16 with the cloud metadata address, RFC 1918, CGNAT
100.64.0.0/10, ULA fc00::/7, documentation and reserved ranges, unspecified) and multicast
and the host's own addresses, public ones included: a sandbox must not reach services
that listen on the machine it runs on. IPv4-mapped IPv6 addresses are judged as the IPv4
address they carry. The host's addresses are read from the kernel (/proc/net/fib_trie for
IPv4 LOCAL routes, /proc/net/if_inet6) and re-read every `HOST_ADDRESSES_TTL_S`.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from pathlib import Path

__all__ = ["HOST_ADDRESSES_TTL_S", "AddressGuard", "host_addresses"]

logger = logging.getLogger(__name__)

HOST_ADDRESSES_TTL_S = 30.0
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def host_addresses(proc: Path = Path("/proc/net")) -> frozenset[IPAddress]:
    """Every address assigned to this host's interfaces (blocking: reads /proc)."""
    found: set[IPAddress] = set()
    try:
        last: str | None = None
        for line in (proc / "fib_trie").read_text().splitlines():
            words = line.split()
            if len(words) == 2 and words[0] in ("|--", "+--"):
                last = words[1]
            elif "/32 host LOCAL" in line and last is not None:
                found.add(ipaddress.IPv4Address(last))
    except (OSError, ValueError) as exc:
        logger.warning("could not read the host's IPv4 addresses (%s); only non-public ones are refused", exc)
    try:
        for line in (proc / "if_inet6").read_text().splitlines():
            found.add(ipaddress.IPv6Address(int(line.split()[0], 16)))
    except FileNotFoundError:
        pass  # no IPv6 on this host: nothing to add
    except (OSError, ValueError, IndexError) as exc:
        logger.warning("could not read the host's IPv6 addresses (%s); only non-public ones are refused", exc)
    return frozenset(found)


class AddressGuard:
    """Says why an address is refused; knows the host's own addresses (refreshed)."""

    def __init__(self) -> None:
        self._own: frozenset[IPAddress] = frozenset()
        self._read_at = -HOST_ADDRESSES_TTL_S

    def refresh(self) -> None:
        """Re-read the host's addresses if they are older than the TTL (blocking)."""
        if time.monotonic() - self._read_at >= HOST_ADDRESSES_TTL_S:
            self._own = host_addresses()
            self._read_at = time.monotonic()

    def refusal(self, address: IPAddress) -> str | None:
        """What `address` is if a sandbox may never reach it ("a loopback address"...),
        or None if it is public."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address.is_loopback:
            return "a loopback address"
        if address.is_link_local:
            return "a link-local address (where cloud metadata lives)"
        if address in self._own:
            return "an address of the host"
        if address.is_private:
            return "a private address"
        if not address.is_global or address.is_multicast or address.is_reserved or address.is_unspecified:
            return "not a public address"
        return None
