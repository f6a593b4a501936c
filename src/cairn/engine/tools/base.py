"""What a tool is to the engine, and what one call of it can come to.

A `Tool` is a spec the model sees, a parser for its arguments, an executor, and the shape
of the item its call is recorded as. Who runs it is its `kind`: the workspace (built-in
tools, run by Cairn against the session's workspace), the client (the call is handed
to the client, which answers with a tool result) or the operator (its Python function, run
in the worker: `cairn.engine.tools.operator`). Every call of every kind goes through the
pipeline (`cairn.engine.tools.pipeline`), which ends a call with a `ToolResult`, or stops it
with a `Hold`: the call stays recorded and open, the turn waits for what the hold names, and
nothing ran.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cairn.errors import InvalidRequestError
from cairn.models.base import ToolCall, ToolSpec
from cairn.operator.context import ApprovalView
from cairn.operator.credentials import Credentials
from cairn.operator.run_context import RunContext
from cairn.redaction import KnownValues
from cairn.sandbox.egress import WireSecret
from cairn.states import ItemStatus
from cairn.store.items import ItemRecord
from cairn.store.sessions import SessionRecord

__all__ = [
    "ApprovalView",
    "CommandResult",
    "Hold",
    "Tool",
    "ToolArgumentError",
    "ToolContext",
    "ToolResult",
    "arguments_json",
    "recorded_call",
]


class ToolArgumentError(InvalidRequestError):
    """The model called a tool with arguments its schema refuses: a tool error it sees."""

    default_code = "invalid_tool_arguments"


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A finished call: its output, or the error the model sees instead."""

    output: str | None = None
    error: str | None = None
    # The error is worth another attempt (the tool raised `cairn.RetryableToolError`): the
    # idempotency ledger retries the call instead of recording the error.
    retryable: bool = False

    @property
    def status(self) -> ItemStatus:
        return ItemStatus.COMPLETED if self.error is None else ItemStatus.FAILED


@dataclass(frozen=True, slots=True)
class CommandResult(ToolResult):
    """A finished shell command: its item also shows how it ended."""

    exit_code: int | None = None
    duration_ms: int = 0

    @property
    def status(self) -> ItemStatus:
        return ItemStatus.COMPLETED if self.error is None and self.exit_code == 0 else ItemStatus.FAILED


@dataclass(frozen=True, slots=True)
class Hold:
    """A call stopped before it ran: the turn waits until what its required action names is
    done. The session shows the action in `required_actions` as `{type: action_kind,
    call_id, **action, turn_id}`.

    `awaits_client` marks the client's own round trip: the client's tool result ends such a
    hold by recording the call's output, so it is over as soon as that output exists.
    """

    call_id: str
    action_kind: str
    action: Mapping[str, Any]
    awaits_client: bool = False


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool sees of the call it runs: whose call it is, where its output goes, the
    approval it runs under (set by the gate when the call needed one), the operation key
    of its side effect (set by the ledger's reserve stage), and what this execution has of
    the session's credentials (`cairn.engine.vaults.injection`): operator tools get them by
    name, sandboxed commands only their placeholders, and their values are what redaction
    takes out of everything stored."""

    session: SessionRecord
    turn_id: str
    call_id: str
    # Streams a piece of output to the call's item while it runs (a command's output).
    stream_output: Callable[[str], None]
    approval: ApprovalView | None = None
    operation_key: str | None = None
    credentials: Credentials = field(default_factory=Credentials)
    # Variable name -> placeholder, of the session's environment_variable credentials.
    placeholders: Mapping[str, str] = field(default_factory=dict)
    # The same credentials as the egress proxy substitutes them (values in memory only).
    wire_secrets: Sequence[WireSecret] = ()
    known_values: KnownValues = field(default_factory=KnownValues)
    # The run's persisted context (operator tools' `ctx.context`).
    run_context: RunContext = field(default_factory=RunContext)

    @property
    def tenant(self) -> str:
        return self.session.tenant

    @property
    def sandbox_env(self) -> dict[str, str]:
        """The variables a sandboxed command gets: the session's plain `environment.env` with any
        known secret value in it redacted (a credential's value never goes in through it), then
        the credentials' placeholders."""
        return {**self.known_values.redactor.value(dict(self.session.env)), **self.placeholders}


def arguments_json(arguments: Mapping[str, Any]) -> str:
    """A call's arguments as its item records them and the client is shown them."""
    return json.dumps(dict(arguments), ensure_ascii=False)


def recorded_call(item: ItemRecord) -> ToolCall:
    """The call a recorded call item stands for (the inverse of `Tool.call_item`)."""
    name = "shell" if item.type == "command_execution" else str(item.data["name"])
    return ToolCall(call_id=str(item.call_id), name=name, arguments=_decode_arguments(item.data.get("arguments")))


def _decode_arguments(raw: Any) -> Mapping[str, Any]:
    if isinstance(raw, Mapping):
        return raw
    try:
        decoded = json.loads(raw) if isinstance(raw, str) else None
    except json.JSONDecodeError:
        decoded = None
    return decoded if isinstance(decoded, dict) else {}


class Tool(abc.ABC):
    """One tool of a turn.

    `parse` is a pure check of the arguments (the same arguments always give the same
    answer, so a call resumed after a hold is validated again unchanged). `execute` runs
    the call with the parsed arguments and returns its result, or a `Hold` when the call
    is not Cairn's to run now (a client tool). `is_read_only` promises that running the call
    again changes nothing, which lets the engine run it before its record and again after a
    crash.
    """

    is_read_only: bool = False

    def __init__(self, spec: ToolSpec) -> None:
        self.spec = spec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.kind

    def call_item(self, call: ToolCall) -> tuple[str, dict[str, Any]]:
        """The type and content of the item that records `call` before it runs."""
        return "function_call", {"call_id": call.call_id, "name": call.name, "arguments": arguments_json(call.arguments)}

    @abc.abstractmethod
    def parse(self, arguments: Mapping[str, Any]) -> Any:
        """The arguments as the tool runs them; raises `ToolArgumentError`."""

    @abc.abstractmethod
    async def execute(self, arguments: Any, ctx: ToolContext) -> ToolResult | Hold:
        """Run the call. A tool error the model should see is a result with `error`, not a raise."""
