"""The sandbox section of `cairn doctor`: which backend runs commands here, and how safely.

Design invariant 8 says a backend that does not isolate says so; this is where an operator
reads it, along with every resource limit and the mechanism enforcing it on this host (or
that nothing does). Selection failures are reported, not raised: a host where no backend
isolates is exactly what the operator needs to see.
"""

from __future__ import annotations

from collections.abc import Mapping

from cairn.errors import SandboxError
from cairn.sandbox.base import SandboxBackend
from cairn.sandbox.egress import EgressCA, EgressProxy, EgressSettings
from cairn.sandbox.selection import select_backend

__all__ = ["describe_host"]


def describe_host(backend_name: str | None = None, egress: EgressSettings | None = None) -> str:
    """Return a printable report for the backend `select_backend(backend_name)` gives,
    with the egress proxy `egress` configures (the operator's settings).

    Blocking (it probes the host by running a sandboxed command): call it from the CLI, or
    through `run_sync`.
    """
    requested = backend_name or "auto"
    try:
        backend = select_backend(backend_name)
    except SandboxError as exc:
        return f"sandbox (requested: {requested})\n  NO USABLE BACKEND: {exc}\n"
    backend.use_egress(EgressProxy(egress or EgressSettings(), EgressCA.ephemeral()))
    lines = [f"sandbox (requested: {requested}): backend {backend.name}",
             f"  {backend.description}", f"  egress mode: {_egress_mode(backend)}"]
    if "isolation" not in backend.capabilities:
        lines.append("  WARNING: this backend does not isolate commands from the host")
    elif "process_isolation" not in backend.capabilities:
        lines.append("  WARNING: host processes are visible to commands (no pid namespace)")
    lines += _section("isolation", backend.isolation)
    lines += _section("limits in force", backend.limits_in_force)
    owner = backend.file_owner
    lines.append(
        "  workspace files owned by: "
        + (f"uid {owner[0]} gid {owner[1]}" if owner else "the server's own user")
    )
    return "\n".join(lines) + "\n"


def _egress_mode(backend: SandboxBackend) -> str:
    if "isolation" not in backend.capabilities:
        return "NONE: commands with network use the host's network directly (unconfined)"
    if "egress" not in backend.capabilities:
        return "no network: commands of sessions with network are refused (the egress proxy needs bwrap)"
    return "proxy: every enabled or restricted network goes through Cairn's egress proxy (see isolation: egress)"


def _section(title: str, entries: Mapping[str, str]) -> list[str]:
    width = max((len(key) for key in entries), default=0)
    return [f"  {title}:"] + [f"    {key.ljust(width)}  {value}" for key, value in entries.items()]
