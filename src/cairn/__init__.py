"""Cairn: a self-hosted, durable runtime for LLM agents that work in sandboxed workspaces."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairn.client import Client

__all__ = ["Client"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Imported on first use: the client pulls in the whole official `openai` package,
    # which the server and the CLI's other commands need not pay for at start-up.
    if name == "Client":
        from cairn.client import Client

        return Client
    raise AttributeError(f"module 'cairn' has no attribute {name!r}")
