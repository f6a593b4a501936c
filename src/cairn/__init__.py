"""Cairn: a self-hosted, durable runtime for LLM agents that work in sandboxed workspaces.

What an operator writes against (docs/agents.md):

    @cairn.tool(needs_approval=True, side_effect=True, approvers=["approver"])
    async def deploy_release(ctx: cairn.ToolContext, release: str) -> str: ...

    registry = cairn.AgentRegistry()

    @registry.agent("release-agent/v1")
    def release_agent_v1(deps: cairn.RuntimeDeps) -> cairn.Agent: ...

and `cairn.Client`, the official `openai` client pointed at a Cairn server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairn.client import Client
    from cairn.operator import (
        Agent,
        AgentRegistry,
        ApprovalPolicy,
        ApprovalView,
        Credentials,
        EnvironmentVariable,
        McpOAuth,
        ProbeAnswer,
        RetryableToolError,
        RunContext,
        RuntimeDeps,
        StaticBearer,
        ToolContext,
        commands_matching,
        matching,
        tool,
    )

__all__ = [
    "Agent",
    "AgentRegistry",
    "ApprovalPolicy",
    "ApprovalView",
    "Client",
    "Credentials",
    "EnvironmentVariable",
    "McpOAuth",
    "ProbeAnswer",
    "RetryableToolError",
    "RunContext",
    "RuntimeDeps",
    "StaticBearer",
    "ToolContext",
    "commands_matching",
    "matching",
    "tool",
]
__version__ = "0.1.0"

# Imported on first use: the client pulls in the whole official `openai` package, which the
# server and the CLI's other commands need not pay for at start-up; the operator's names are
# loaded only by code that uses them.
_HOMES = {"Client": "cairn.client", **{name: "cairn.operator" for name in __all__ if name != "Client"}}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'cairn' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
