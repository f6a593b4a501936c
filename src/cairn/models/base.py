"""The model interface: one streaming call from a prepared input to text and tool calls.

A `Model` is as narrow as an httpx transport: `stream()` turns a `ModelRequest` into
`TextDelta`s followed by exactly one `ModelResponse`. Retries, tool execution and
persistence belong to the engine. Providers never see secrets of the session beyond what
their own configuration holds.

Resume invariant: a request is identified by `(session_id, turn_id, step)`; the engine
re-issues the same step after a crash, so a deterministic model (the scripted one) gives
the same answer again and a real model simply answers again.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

__all__ = [
    "FunctionCallInput",
    "FunctionCallOutputInput",
    "InputItem",
    "MessageInput",
    "Model",
    "ModelEvent",
    "ModelRequest",
    "ModelResponse",
    "TextDelta",
    "ToolCall",
    "ToolSpec",
    "Usage",
]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call. `kind` says who runs it: the workspace, the client, or the
    operator's code in the worker."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    kind: Literal["workspace", "client", "operator"]


@dataclass(frozen=True, slots=True)
class MessageInput:
    role: Literal["user", "assistant", "system"]
    text: str


@dataclass(frozen=True, slots=True)
class FunctionCallInput:
    call_id: str
    name: str
    arguments: str  # the JSON text the model produced, kept verbatim


@dataclass(frozen=True, slots=True)
class FunctionCallOutputInput:
    call_id: str
    output: str


InputItem = MessageInput | FunctionCallInput | FunctionCallOutputInput


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """Everything a provider needs for one step; `turn_ordinal` and `step` locate it durably."""

    session_id: str
    turn_id: str
    turn_ordinal: int
    step: int
    model: str
    instructions: str | None
    input: Sequence[InputItem]
    tools: Sequence[ToolSpec]
    text_format: Mapping[str, Any] | None = None
    reasoning_effort: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    call_id: str
    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """The end of one step: final text, tool calls, or both (text first)."""

    text: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)


ModelEvent = TextDelta | ModelResponse


class Model(abc.ABC):
    """A model provider bound to one configuration.

    `stream` yields zero or more `TextDelta`s whose concatenation equals the final
    `ModelResponse.text`, then exactly one `ModelResponse`. Failures raise `ModelError`
    with a turn error code (spec §3.6) and a `retryable` hint.
    """

    capabilities: ClassVar[frozenset[str]] = frozenset()

    @abc.abstractmethod
    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Answer one step."""

    async def aclose(self) -> None:
        """Release provider resources; nothing to do by default."""
