"""Sandbox egress: the proxy that is the only way out of a sandbox with network, its
policy, and the credentials it substitutes on the wire (docs/security.md, "Egress")."""

from cairn.config import EgressSettings
from cairn.sandbox.egress.ca import EgressCA
from cairn.sandbox.egress.credentials import SessionEgress, WireSecret
from cairn.sandbox.egress.policy import NetworkPolicy, parse_domain_patterns
from cairn.sandbox.egress.proxy import EgressProxy
from cairn.sandbox.egress.reports import EgressEvent, EgressKind, EgressReports

__all__ = [
    "EgressCA",
    "EgressEvent",
    "EgressKind",
    "EgressProxy",
    "EgressReports",
    "EgressSettings",
    "NetworkPolicy",
    "SessionEgress",
    "WireSecret",
    "parse_domain_patterns",
]
