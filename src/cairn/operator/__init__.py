"""Operator agents: the agents and Python tools a deployment defines in its own code.

The operator writes `@cairn.tool` functions and an `AgentRegistry` of versioned factories
that build `cairn.Agent`s from the process's `RuntimeDeps`; `cairn serve --agents MODULE:ATTR`
and `cairn worker --agents MODULE:ATTR` load it (`load_agents`). The engine offers a pinned
session the tools of its version, runs operator tools in the worker, and asks a
`LoadedAgent` which calls need an approval (`approval_for`). This package only describes
agents; it runs nothing and imports nothing of the engine (docs/agents.md).
"""

from cairn.errors import AgentDefinitionError, AgentVersionError, RetryableToolError
from cairn.operator.agent import Agent
from cairn.operator.context import ApprovalView, ToolContext
from cairn.operator.credentials import Credential, Credentials, EnvironmentVariable, McpOAuth, StaticBearer
from cairn.operator.deps import RuntimeDeps
from cairn.operator.effects import ProbeAnswer, ProbeVerdict
from cairn.operator.loaded import BuiltinTools, LoadedAgent, LoadedAgents, revision_of
from cairn.operator.loading import load_agents, load_registry
from cairn.operator.policy import (
    DEFAULT_APPROVERS,
    ApprovalPolicy,
    ApprovalRequirement,
    ArgumentsMatching,
    commands_matching,
    matching,
)
from cairn.operator.registry import AgentFactory, AgentRegistry
from cairn.operator.run_context import ContextSchema, RunContext
from cairn.operator.tool import OperatorToolDef, SideEffect, tool

__all__ = [
    "DEFAULT_APPROVERS",
    "Agent",
    "AgentDefinitionError",
    "AgentFactory",
    "AgentRegistry",
    "AgentVersionError",
    "ApprovalPolicy",
    "ApprovalRequirement",
    "ApprovalView",
    "ArgumentsMatching",
    "BuiltinTools",
    "ContextSchema",
    "Credential",
    "Credentials",
    "EnvironmentVariable",
    "LoadedAgent",
    "LoadedAgents",
    "McpOAuth",
    "OperatorToolDef",
    "ProbeAnswer",
    "ProbeVerdict",
    "RetryableToolError",
    "RunContext",
    "RuntimeDeps",
    "SideEffect",
    "StaticBearer",
    "ToolContext",
    "commands_matching",
    "load_agents",
    "load_registry",
    "matching",
    "revision_of",
    "tool",
]
