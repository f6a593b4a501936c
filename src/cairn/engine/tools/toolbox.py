"""The tools of one turn: what the model is offered, and the tool each call names.

A session with a hosted environment gets the built-in workspace tools; the agent's function
tools are client tools. A session pinned to a registered agent's version gets that version's
tools instead, in its order: the built-ins it names (with a workspace) and its operator tools,
each an `AgentTool` (a call its policy says needs an approval is recorded as `mcp_call`), then
the session's client tools. A call that names no tool of the turn still goes through the
pipeline, as an `UnknownTool` whose validation refuses it with the list of tools there are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from cairn.engine.tools.base import Tool, ToolArgumentError, ToolContext
from cairn.engine.tools.client import ClientTool, client_tool_specs
from cairn.engine.tools.operator import AgentTool, OperatorTool
from cairn.engine.tools.shell import ShellTool
from cairn.engine.tools.workspace import file_tools
from cairn.engine.workspace_files import WorkspaceFiles
from cairn.errors import CairnMisuseError
from cairn.models.base import ToolSpec
from cairn.operator import LoadedAgent, LoadedAgents
from cairn.sandbox.base import SandboxBackend
from cairn.store.sessions import SessionRecord

__all__ = ["Toolbox", "UnknownTool", "workspace_tools"]


def workspace_tools(
    sandbox: SandboxBackend,
    workspace_of: Callable[[str], Path],
    files_of: Callable[[str], WorkspaceFiles],
    *,
    command_timeout_s: float,
) -> list[Tool]:
    """The built-in tools, in the order the model is shown them."""
    return [ShellTool(sandbox, workspace_of, default_timeout_s=command_timeout_s), *file_tools(files_of)]


class UnknownTool(Tool):
    """A name the model made up: refused at validation, never executed."""

    def __init__(self, name: str, available: Sequence[str]) -> None:
        super().__init__(ToolSpec(name=name, description="", parameters={}, kind="workspace"))
        self._available = available

    def parse(self, arguments: Mapping[str, Any]) -> NoReturn:
        raise ToolArgumentError(f"unknown tool {self.name!r}; available tools: {', '.join(self._available)}")

    async def execute(self, arguments: Any, ctx: ToolContext) -> NoReturn:
        raise CairnMisuseError(f"the unknown tool {self.name!r} passed validation")


class Toolbox:
    def __init__(self, tools: Sequence[Tool]) -> None:
        self._tools = {tool.name: tool for tool in tools}

    @classmethod
    def for_session(
        cls, session: SessionRecord, builtin: Callable[[], Sequence[Tool]], agents: LoadedAgents | None = None
    ) -> Toolbox:
        """The session's tools: the `builtin` ones when it has a workspace (those its pinned
        agent names, with its operator tools, when it has one), then its client tools.
        Raises `AgentVersionError` when the pinned version is not in `agents` unchanged."""
        workspace = list(builtin()) if session.environment["type"] != "none" else []
        client = [ClientTool(spec) for spec in client_tool_specs(session.agent)]
        if session.agent_version is None:
            return cls([*workspace, *client])
        loaded = agents or LoadedAgents()
        agent = loaded.pinned(session.agent_version, session.agent_revision)
        own = _agent_tools(agent, {t.name: t for t in workspace}, loaded)
        names = {t.name for t in own} | {t.name for t in agent.agent.operator_tools}
        return cls([*own, *(c for c in client if c.name not in names)])

    @property
    def specs(self) -> list[ToolSpec]:
        return [tool.spec for tool in self._tools.values()]

    def get(self, name: str) -> Tool:
        return self._tools.get(name) or UnknownTool(name, list(self._tools))


def _agent_tools(agent: LoadedAgent, workspace: Mapping[str, Tool], agents: LoadedAgents) -> list[Tool]:
    """The agent's own tools, in its order: the built-ins it names that the session has, and
    its operator tools."""
    tools: list[Tool] = []
    for entry in agent.agent.tools:
        if isinstance(entry, str):
            if entry in workspace:
                tools.append(AgentTool(workspace[entry], agent))
        else:
            tools.append(AgentTool(OperatorTool(entry, agents.deps), agent))
    return tools
