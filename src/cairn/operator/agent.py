"""`cairn.Agent`: what one version of an operator's agent is.

A factory in an `AgentRegistry` returns one: the model, the instructions, the tools (operator
tools made with `@cairn.tool`, and the names of the built-in workspace tools it may use:
"shell", "read_file", "write_file", "apply_patch"), the approval policy of each built-in
tool it names (`approvals`; operator tools carry their own) and the declared keys of its
runs' persisted context (`context`, `cairn.operator.run_context`). Checked when it is made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cairn.errors import AgentDefinitionError
from cairn.operator.policy import ApprovalPolicy, Predicate
from cairn.operator.run_context import ContextSchema
from cairn.operator.tool import OperatorToolDef

__all__ = ["Agent"]


@dataclass(frozen=True)
class Agent:
    model: str
    instructions: str | None = None
    tools: Sequence[OperatorToolDef[..., Any] | str] = ()
    # Built-in tool name -> its policy: True (always), False (never), a predicate over the
    # parsed arguments (e.g. `cairn.commands_matching(r"^git push")`) or an ApprovalPolicy.
    approvals: Mapping[str, bool | Predicate | ApprovalPolicy] = field(default_factory=dict)
    # Shown as the agent's name; when given it must be the registry name of its version.
    name: str | None = None
    # The keys of its runs' persisted context (`ctx.context`), each with its type:
    # {"user": str, "ticket": int | None}. A key not declared here is refused when a turn pauses.
    context: Mapping[str, Any] | ContextSchema = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise AgentDefinitionError(f"cairn.Agent needs a model name, not {self.model!r}")
        if self.instructions is not None and not isinstance(self.instructions, str):
            raise AgentDefinitionError(f"cairn.Agent instructions are text, not {type(self.instructions).__name__}")
        if isinstance(self.tools, (str, bytes)) or not isinstance(self.tools, Sequence):
            raise AgentDefinitionError("cairn.Agent tools are a list of @cairn.tool functions and built-in tool names")
        tools = tuple(self.tools)
        seen: set[str] = set()
        for entry in tools:
            if not isinstance(entry, (OperatorToolDef, str)):
                raise AgentDefinitionError(f"cairn.Agent tools: {entry!r} is neither a @cairn.tool function nor a built-in tool name")
            name = entry if isinstance(entry, str) else entry.name
            if name in seen:
                raise AgentDefinitionError(f"cairn.Agent tools: {name!r} is listed twice")
            seen.add(name)
        builtins = {t for t in tools if isinstance(t, str)}
        policies: dict[str, ApprovalPolicy] = {}
        for name, policy in dict(self.approvals).items():
            if name not in builtins:
                raise AgentDefinitionError(
                    f"cairn.Agent approvals: {name!r} is not a built-in tool of this agent "
                    "(list it in tools; an operator tool takes its policy in @cairn.tool)"
                )
            policies[name] = ApprovalPolicy.of(f"built-in tool {name!r}", needs_approval=policy)
        object.__setattr__(self, "tools", tools)
        object.__setattr__(self, "approvals", policies)
        if not isinstance(self.context, ContextSchema):
            if not isinstance(self.context, Mapping):
                raise AgentDefinitionError("cairn.Agent context is a mapping of key names to their types")
            object.__setattr__(self, "context", ContextSchema(self.context))

    @property
    def context_schema(self) -> ContextSchema:
        assert isinstance(self.context, ContextSchema)
        return self.context

    @property
    def operator_tools(self) -> tuple[OperatorToolDef[..., Any], ...]:
        return tuple(t for t in self.tools if isinstance(t, OperatorToolDef))

    @property
    def builtin_tools(self) -> tuple[str, ...]:
        return tuple(t for t in self.tools if isinstance(t, str))

    def builtin_policy(self, name: str) -> ApprovalPolicy:
        policy = self.approvals.get(name)
        return policy if isinstance(policy, ApprovalPolicy) else ApprovalPolicy()
