"""The agent a session runs: its own (`agent`), or a registered one (`agent_id`).

A session created with `agent_id` runs the newest version of that registered agent and is
pinned to it (version and revision) for its life; the fields of `agent` override the
version's (model, instructions, reasoning, …) as for any saved agent of the Agents API, and
its function tools are the session's client tools, beside the agent's own. The session's
stored agent shows the agent's operator tools as function tools; the turn takes them from
the worker's registry (`cairn.engine.tools.toolbox`), never from this stored copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cairn.engine.tools import WORKSPACE_TOOL_NAMES
from cairn.errors import InvalidRequestError
from cairn.operator import LoadedAgent, LoadedAgents
from cairn.store.sessions import SessionRecord

__all__ = ["new_session_agent", "updated_agent"]


def new_session_agent(
    agents: LoadedAgents, session_id: str, given: Mapping[str, Any], agent_id: str | None
) -> tuple[dict[str, Any], LoadedAgent | None]:
    """The agent a new session stores, and the registered version it is pinned to (if any)."""
    if agent_id is None:
        _check_client_tools(given.get("tools"), None)
        return {"id": f"agent_{session_id.removeprefix('sess_')}", **given}, None
    loaded = agents.newest(agent_id)
    if loaded is None:
        registered = ", ".join(agents.names())
        known = f"registered agents: {registered}" if registered else "this server was started without --agents"
        raise InvalidRequestError(f"unknown agent_id {agent_id!r}: no agent of that id is registered ({known})", param="agent_id")
    client_tools = list(given.get("tools") or [])
    _check_client_tools(client_tools, loaded)
    agent: dict[str, Any] = {"id": loaded.name, "name": loaded.name, "model": loaded.agent.model}
    if loaded.agent.instructions is not None:
        agent["instructions"] = loaded.agent.instructions
    agent.update({key: value for key, value in given.items() if key != "tools"})
    agent["tools"] = [*loaded.function_tools(), *client_tools]
    return agent, loaded


def updated_agent(agents: LoadedAgents, session: SessionRecord, changes: Mapping[str, Any]) -> dict[str, Any]:
    """The session's agent with an update's `agent` fields; new `tools` replace the session's
    client tools (a registered agent's own tools stay)."""
    agent = {**session.agent, **{key: value for key, value in changes.items() if key != "tools"}}
    if "tools" not in changes:
        return agent
    client_tools = list(changes["tools"] or [])
    if session.agent_version is None:
        _check_client_tools(client_tools, None)
        agent["tools"] = client_tools
        return agent
    loaded = agents.get(session.agent_version)
    if loaded is None:
        raise InvalidRequestError(
            f"this server does not have agent version {session.agent_version}, which the session is pinned to; "
            "its tools cannot change here",
            param="agent.tools",
        )
    _check_client_tools(client_tools, loaded)
    agent["tools"] = [*loaded.function_tools(), *client_tools]
    return agent


def _check_client_tools(tools: Sequence[Mapping[str, Any]] | None, loaded: LoadedAgent | None) -> None:
    """Function tool names are unique, and none is taken by a built-in or the agent's own tool."""
    seen: set[str] = set()
    for index, tool in enumerate(tools or []):
        if tool.get("type") != "function":
            continue
        name = str(tool.get("name"))
        if name in WORKSPACE_TOOL_NAMES:
            raise InvalidRequestError(f"function tool name {name!r} is taken by a built-in workspace tool", param=f"agent.tools[{index}].name")
        if loaded is not None and loaded.operator_tool(name) is not None:
            raise InvalidRequestError(
                f"function tool name {name!r} is taken by a tool of agent {loaded.name}", param=f"agent.tools[{index}].name"
            )
        if name in seen:
            raise InvalidRequestError(f"duplicate function tool name {name!r}", param=f"agent.tools[{index}].name")
        seen.add(name)
