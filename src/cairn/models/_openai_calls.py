"""Assembles streamed function-call fragments into `ToolCall`s with decoded arguments.

Both OpenAI APIs stream a call in pieces keyed by an index (the Responses API's
`output_index`, Chat Completions' `tool_calls[].index`), several calls interleaved when the
model calls tools in parallel. This module owns the one policy both APIs share: what a call's
arguments become when the model did not produce a JSON object.

Malformed arguments never fail the turn. They are the model's mistake, the model can fix them
when told, and failing the turn would blame the caller (`invalid_request`) for it. So text that
is not a JSON object becomes `{RAW_ARGUMENTS_KEY: <the text, verbatim>}`; the engine must look
for that key before running the tool and answer the call with an error output instead.
Blank arguments (some servers send none for a tool without parameters) decode to `{}`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cairn.errors import ModelError
from cairn.models.base import ToolCall

__all__ = ["RAW_ARGUMENTS_KEY", "CallAssembler", "decode_arguments"]

RAW_ARGUMENTS_KEY = "_raw"


def decode_arguments(text: str) -> Mapping[str, Any]:
    """Decode a call's argument text; see the module docstring for malformed text."""
    if not text.strip():
        return {}
    try:
        decoded = json.loads(text)
    except ValueError:
        return {RAW_ARGUMENTS_KEY: text}
    if not isinstance(decoded, dict):
        return {RAW_ARGUMENTS_KEY: text}
    return decoded


@dataclass(slots=True)
class _PartialCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class CallAssembler:
    """Collects the calls of one model step, in the order of their stream index."""

    def __init__(self) -> None:
        self._calls: dict[int, _PartialCall] = {}

    def add_fragment(
        self,
        index: int,
        *,
        call_id: str | None = None,
        name: str | None = None,
        arguments: str | None = None,
    ) -> None:
        """Add one streamed piece; `arguments` fragments are concatenated in arrival order."""
        call = self._calls.setdefault(index, _PartialCall())
        # OpenAI sends the id and name once; some compatible servers repeat them on every
        # chunk. Keeping the first value handles both without doubling the name.
        if call_id and not call.call_id:
            call.call_id = call_id
        if name and not call.name:
            call.name = name
        if arguments:
            call.arguments.append(arguments)

    def complete(self, index: int, *, call_id: str, name: str, arguments: str) -> None:
        """Record the final form of a call, which wins over the fragments streamed before it."""
        self._calls[index] = _PartialCall(call_id=call_id, name=name, arguments=[arguments])

    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The assembled calls; a call without an id or a name is a protocol violation."""
        calls = []
        for index in sorted(self._calls):
            call = self._calls[index]
            if not call.call_id or not call.name:
                raise ModelError(
                    f"the model endpoint streamed tool call #{index} without an id or a name",
                    code="server_error",
                    retryable=False,
                    context={"call_index": index},
                )
            calls.append(ToolCall(call.call_id, call.name, decode_arguments("".join(call.arguments))))
        return tuple(calls)
