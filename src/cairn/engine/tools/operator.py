"""Operator tools, and the tools of a registered agent's session.

`OperatorTool` is a `@cairn.tool` function as a tool of the turn: its arguments are checked
against the function's schema (a bad one is a tool error the model sees), and it runs in the
worker process, not the sandbox, with a `cairn.ToolContext`. Whatever the function raises is a
tool error the model sees (its message), logged with the traceback; the turn goes on.

`AgentTool` wraps every tool of a pinned session (operator tools and the built-ins its agent
names) so that a call its agent's policy says needs an approval is recorded as an `mcp_call`
item (`server_label` = the agent's name) instead of the tool's usual item; the approval gate
holds exactly those. A tool whose policy may ask for an approval is never run ahead of its
record, so the gate always sees the recorded item.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from cairn.engine.tools.base import Hold, Tool, ToolArgumentError, ToolContext, ToolResult, arguments_json
from cairn.errors import InvalidRequestError
from cairn.models.base import ToolCall, ToolSpec
from cairn.operator import LoadedAgent, OperatorToolDef, RuntimeDeps
from cairn.operator import ToolContext as PublicToolContext

__all__ = ["AgentTool", "OperatorTool"]

log = logging.getLogger(__name__)


class OperatorTool(Tool):
    def __init__(self, definition: OperatorToolDef[..., Any], deps: RuntimeDeps) -> None:
        super().__init__(ToolSpec(definition.name, definition.description, definition.parameters, kind="operator"))
        self.definition = definition
        self._deps = deps

    def parse(self, arguments: Mapping[str, Any]) -> BaseModel:
        try:
            return self.definition.parse(arguments)
        except InvalidRequestError as exc:
            raise ToolArgumentError(exc.message) from exc

    async def execute(self, arguments: Any, ctx: ToolContext) -> ToolResult:
        assert isinstance(arguments, BaseModel)
        public = PublicToolContext(
            tenant=ctx.tenant,
            session_id=ctx.session.id,
            turn_id=ctx.turn_id,
            call_id=ctx.call_id,
            deps=self._deps,
            approval=ctx.approval,
        )
        try:
            return ToolResult(output=self.definition.render_output(await self.definition.invoke(public, arguments)))
        except Exception as exc:
            log.exception("operator tool %s failed (session %s, call %s)", self.name, ctx.session.id, ctx.call_id)
            return ToolResult(error=_message(exc))


class AgentTool(Tool):
    """A tool of a registered agent: itself, except for the item a call that needs an
    approval is recorded as."""

    def __init__(self, tool: Tool, agent: LoadedAgent) -> None:
        super().__init__(tool.spec)
        self.tool = tool
        self.agent = agent
        self.is_read_only = tool.is_read_only and not agent.may_need_approval(tool.name)

    def call_item(self, call: ToolCall) -> tuple[str, dict[str, Any]]:
        if self.agent.approval_for(call.name, call.arguments) is None:
            return self.tool.call_item(call)
        return "mcp_call", {
            "server_label": self.agent.name,
            "name": call.name,
            "arguments": arguments_json(call.arguments),
            "output": None,
            "error": None,
        }

    def parse(self, arguments: Mapping[str, Any]) -> Any:
        return self.tool.parse(arguments)

    async def execute(self, arguments: Any, ctx: ToolContext) -> ToolResult | Hold:
        return await self.tool.execute(arguments, ctx)


def _message(exc: Exception) -> str:
    text = exc.message if isinstance(exc, InvalidRequestError) else str(exc)
    return text or type(exc).__name__
