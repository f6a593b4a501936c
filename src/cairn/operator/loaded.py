"""The agents a process loaded: each registered version built with the process's runtime
dependencies, its revision, and the approval policy of its tools as data.

The revision is a SHA-256 digest of what a version offers the model and how its calls are
approved: the instructions, each tool's name, description, JSON schema and options, the
built-in tools it names and their policies, and the types of its runs' context keys. A factory changed under the same version string
gets a new revision, which is how a pinned session notices (`LoadedAgents.pinned`). The
model is not part of it (a session may override the model), nor are the tools' bodies.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from cairn.errors import AgentDefinitionError, AgentVersionError, InvalidRequestError
from cairn.operator.agent import Agent
from cairn.operator.deps import RuntimeDeps
from cairn.operator.policy import ApprovalPolicy, ApprovalRequirement
from cairn.operator.registry import split_version, version_order
from cairn.operator.tool import OperatorToolDef

__all__ = ["BuiltinTools", "LoadedAgent", "LoadedAgents", "revision_of"]


@dataclass(frozen=True, slots=True)
class BuiltinTools:
    """The engine's built-in workspace tools, as an agent's policies need them: their names,
    and the parser of their arguments (raises `InvalidRequestError`)."""

    names: frozenset[str]
    parse: Callable[[str, Mapping[str, Any]], BaseModel]


def revision_of(agent: Agent) -> str:
    """The digest of what `agent` offers the model and how its calls are approved."""
    document: dict[str, Any] = {
        "instructions": agent.instructions,
        "tools": [t.describe() for t in agent.operator_tools],
        "builtin_tools": [{"name": n, "approval": agent.builtin_policy(n).describe()} for n in agent.builtin_tools],
    }
    if agent.context_schema:
        # What its paused runs store: a changed type cannot read what an older one stored.
        document["context"] = agent.context_schema.describe()
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class LoadedAgent:
    """One registered version, built from its factory with the process's deps."""

    def __init__(self, version: str, agent: Agent, builtins: BuiltinTools, *, loaded_at: float | None = None) -> None:
        self.name, _ = split_version(version)
        self.version = version
        self.agent = agent
        if agent.name is not None and agent.name != self.name:
            raise AgentDefinitionError(f"{version}: the agent is named {agent.name!r}, but its version names {self.name!r}")
        unknown = [n for n in agent.builtin_tools if n not in builtins.names]
        if unknown:
            raise AgentDefinitionError(
                f"{version}: {unknown[0]!r} is not a built-in tool (built-in tools: {', '.join(sorted(builtins.names))})"
            )
        clash = [t.name for t in agent.operator_tools if t.name in builtins.names]
        if clash:
            raise AgentDefinitionError(f"{version}: tool name {clash[0]!r} is taken by a built-in tool")
        self._builtins = builtins
        self._operator_tools = {t.name: t for t in agent.operator_tools}
        self.revision = revision_of(agent)
        self.loaded_at = time.time() if loaded_at is None else loaded_at

    def __repr__(self) -> str:
        return f"<LoadedAgent {self.version} {self.revision[:12]}>"

    @property
    def builtin_tools(self) -> tuple[str, ...]:
        return self.agent.builtin_tools

    def operator_tool(self, name: str) -> OperatorToolDef[..., Any] | None:
        return self._operator_tools.get(name)

    def is_side_effect(self, tool_name: str) -> bool:
        """Whether the operator tool changes something outside Cairn (its `side_effect` flag)."""
        tool = self.operator_tool(tool_name)
        return tool is not None and tool.side_effect

    def may_need_approval(self, tool_name: str) -> bool:
        """Whether any call of the tool could need an approval (its policy is not "never")."""
        policy = self._policy(tool_name)
        return policy is not None and policy.may_need_approval

    def approval_for(self, tool_name: str, arguments: Mapping[str, Any]) -> ApprovalRequirement | None:
        """None: the call runs without an approval. `arguments` are the call's arguments as the
        model sent them; the policy's predicate and review see them parsed. Arguments that do
        not validate need an approval if the tool's policy may ask for one (fail closed)."""
        policy = self._policy(tool_name)
        if policy is None or not policy.may_need_approval:
            return None
        operator = self.operator_tool(tool_name)
        try:
            if operator is not None:
                model = operator.parse(arguments)
                parsed: Mapping[str, Any] = operator.keyword_arguments(model)
                snapshot = operator.snapshot(model)
            else:
                model = self._builtins.parse(tool_name, arguments)
                parsed, snapshot = model.model_dump(), model.model_dump(mode="json")
        except InvalidRequestError:
            return policy.requirement(tool_name, None, {})
        return policy.requirement(tool_name, parsed, snapshot)

    def function_tools(self) -> list[dict[str, Any]]:
        """The operator tools as the API's function tools (spec §3.4)."""
        return [
            {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters, "defer_loading": False}
            for t in self.agent.operator_tools
        ]

    def describe(self) -> dict[str, Any]:
        """This version as the API shows it."""
        return {
            "version": self.version,
            "revision": self.revision,
            "model": self.agent.model,
            "instructions": self.agent.instructions,
            "tools": [t.describe() for t in self.agent.operator_tools],
            "builtin_tools": [{"name": n, "approval": self.agent.builtin_policy(n).describe()} for n in self.builtin_tools],
            "loaded_at": int(self.loaded_at),
        }

    def _policy(self, tool_name: str) -> ApprovalPolicy | None:
        operator = self.operator_tool(tool_name)
        if operator is not None:
            return operator.policy
        if tool_name in self.builtin_tools:
            return self.agent.builtin_policy(tool_name)
        return None


class LoadedAgents:
    """What `--agents MODULE:ATTR` gave this process (nothing without the option)."""

    def __init__(self, agents: Iterable[LoadedAgent] = (), deps: RuntimeDeps | None = None, *, source: str | None = None) -> None:
        ordered = sorted(agents, key=lambda a: (a.name, version_order(a.version)))
        self._by_version = {a.version: a for a in ordered}
        self._by_name: dict[str, list[LoadedAgent]] = {}
        for agent in ordered:
            self._by_name.setdefault(agent.name, []).append(agent)
        self.deps = deps if deps is not None else RuntimeDeps()
        self.source = source  # the MODULE:ATTR they came from

    def get(self, version: str) -> LoadedAgent | None:
        return self._by_version.get(version)

    def newest(self, name: str) -> LoadedAgent | None:
        versions = self._by_name.get(name)
        return versions[-1] if versions else None

    def versions(self, name: str) -> list[LoadedAgent]:
        """The versions of `name`, oldest first (empty when there is no such agent)."""
        return list(self._by_name.get(name, ()))

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def all(self) -> list[LoadedAgent]:
        return list(self._by_version.values())

    def pinned(self, version: str, revision: str | None) -> LoadedAgent:
        """The version a session is pinned to, as long as it is loaded here unchanged;
        raises `AgentVersionError` otherwise."""
        loaded = self.get(version)
        if loaded is None:
            have = ", ".join(self._by_version) or "none; it was started without --agents"
            raise AgentVersionError(
                f"this session is pinned to agent version {version}, which this worker does not have (it has: {have})",
                reason="missing",
            )
        if revision is not None and loaded.revision != revision:
            raise AgentVersionError(
                f"agent version {version} changed since this session pinned it (pinned revision {revision[:12]}, "
                f"this worker's {loaded.revision[:12]}); register a changed factory as a new version and keep the old one "
                "while sessions use it",
                reason="revision_changed",
            )
        return loaded
