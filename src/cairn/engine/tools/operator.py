"""Operator tools, and the tools of a registered agent's session.

`OperatorTool` is a `@cairn.tool` function as a tool of the turn: its arguments are checked
against the function's schema (a bad one is a tool error the model sees), and it runs in the
worker process, not the sandbox, with a `cairn.ToolContext`. Whatever the function raises is a
tool error the model sees (its message), logged with the traceback; the turn goes on. A
`cairn.RetryableToolError` is such an error marked retryable, which the idempotency ledger
retries for a side-effecting tool (`side_effect_tool` finds those).

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
from cairn.errors import InvalidRequestError, RetryableToolError
from cairn.models.base import ToolCall, ToolSpec
from cairn.operator import LoadedAgent, OperatorToolDef, ProbeAnswer, RuntimeDeps, SideEffect
from cairn.operator import ToolContext as PublicToolContext

__all__ = ["AgentTool", "OperatorTool", "side_effect_tool"]

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

    @property
    def effect(self) -> SideEffect | None:
        """What the ledger knows of the tool's side effect; None for a tool without one."""
        return self.definition.effect

    def public_context(self, ctx: ToolContext) -> PublicToolContext:
        """The `cairn.ToolContext` the operator's functions receive for this call."""
        return PublicToolContext(
            tenant=ctx.tenant,
            session_id=ctx.session.id,
            turn_id=ctx.turn_id,
            call_id=ctx.call_id,
            deps=self._deps,
            approval=ctx.approval,
            operation_key=ctx.operation_key,
            credentials=ctx.credentials,
            context=ctx.run_context,
            known_values=ctx.known_values,
        )

    async def execute(self, arguments: Any, ctx: ToolContext) -> ToolResult:
        assert isinstance(arguments, BaseModel)
        try:
            return ToolResult(output=self.definition.render_output(await self.definition.invoke(self.public_context(ctx), arguments)))
        except RetryableToolError as exc:
            log.warning("operator tool %s failed, retryable (session %s, call %s): %s", self.name, ctx.session.id, ctx.call_id, exc)
            return ToolResult(error=_message(exc), retryable=True)
        except Exception as exc:
            log.exception("operator tool %s failed (session %s, call %s)", self.name, ctx.session.id, ctx.call_id)
            return ToolResult(error=_message(exc))

    def render_output(self, value: Any) -> str:
        """A value the tool (or its probe) returned, as the model reads it."""
        return self.definition.render_output(value)

    def target(self, arguments: Any) -> Any:
        """The call's target by the tool's `key=` function (None without one); raises what it raises."""
        assert isinstance(arguments, BaseModel)
        return self.definition.target(arguments)

    async def probe(self, arguments: Any, ctx: ToolContext) -> ProbeAnswer | None:
        """The tool's probe's answer for the call (None without a probe); raises what it raises."""
        assert isinstance(arguments, BaseModel)
        return await self.definition.probe(self.public_context(ctx), arguments)


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


def side_effect_tool(tool: Tool) -> OperatorTool | None:
    """The operator tool behind `tool` if it has a side effect (`side_effect=True`): the calls
    the idempotency ledger covers."""
    inner = tool.tool if isinstance(tool, AgentTool) else tool
    return inner if isinstance(inner, OperatorTool) and inner.effect is not None else None


def _message(exc: Exception) -> str:
    text = exc.message if isinstance(exc, InvalidRequestError | RetryableToolError) else str(exc)
    return text or type(exc).__name__
