"""Client tools: the agent's function tools, which the client runs.

Executing one means handing it to the client: the call stops with a `Hold` that awaits the
client, the turn waits (`requires_action`) and the client's tool result, recorded by the
session's input handling, ends the call. Cairn does not check their arguments: the client
defined the schema and judges them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cairn.engine.tools.base import Hold, Tool, ToolContext, arguments_json
from cairn.models.base import ToolSpec

__all__ = ["ClientTool", "client_tool_specs"]


def client_tool_specs(agent: Mapping[str, Any]) -> list[ToolSpec]:
    return [
        ToolSpec(
            name=str(tool["name"]),
            description=str(tool.get("description") or ""),
            parameters=tool.get("parameters") or {"type": "object", "properties": {}},
            kind="client",
        )
        for tool in agent.get("tools") or []
        if tool.get("type") == "function"
    ]


class ClientTool(Tool):
    def parse(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        return arguments

    async def execute(self, arguments: Any, ctx: ToolContext) -> Hold:
        action = {"name": self.name, "arguments": arguments_json(arguments)}
        return Hold(call_id=ctx.call_id, action_kind="function_call", action=action, awaits_client=True)
