"""Turns the session's stored items into the model's input.

The items are the conversation's only record (run state holds references, not copies).
A command execution is shown to the model as a `shell` call and its output, an `mcp_call`
(a call recorded for an approval) as a call of its tool and its output or error; output is
clipped, head and tail, so one noisy command cannot fill the context.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cairn.models.base import FunctionCallInput, FunctionCallOutputInput, InputItem, MessageInput
from cairn.store.items import ItemRecord

__all__ = ["item_input"]

_MODEL_OUTPUT_CHARS = 16_000


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in content or []:
        if isinstance(part, Mapping):
            if "text" in part:
                parts.append(str(part["text"]))
            elif part.get("type") == "input_image":
                parts.append("[image]")
    return "\n".join(parts)


def _clip(text: str) -> str:
    if len(text) <= _MODEL_OUTPUT_CHARS:
        return text
    half = _MODEL_OUTPUT_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - _MODEL_OUTPUT_CHARS} characters omitted ...]\n{text[-half:]}"


def _result_text(data: Mapping[str, Any]) -> str:
    """A finished call's output as the model reads it, or its error."""
    if data.get("error") is not None:
        return f"error: {data['error']}"
    return _text_of(data.get("output"))


def item_input(item: ItemRecord) -> list[InputItem]:
    """What one stored item contributes to the model's input (nothing, one or two entries)."""
    data = item.data
    if item.type == "message":
        text = _text_of(data.get("content"))
        return [MessageInput(role=data.get("role", "user"), text=text)] if text else []
    if item.type in ("function_call", "mcp_call"):
        invocation = FunctionCallInput(call_id=str(item.call_id), name=str(data["name"]), arguments=str(data["arguments"]))
        if item.type == "function_call" or item.status == "in_progress":
            return [invocation]  # a function call's output is an item of its own
        output = _result_text(data)
        if data.get("exit_code") is not None:
            output = f"exit_code: {data['exit_code']}\n{output}"
        return [invocation, FunctionCallOutputInput(call_id=str(item.call_id), output=_clip(output))]
    if item.type == "function_call_output":
        return [FunctionCallOutputInput(call_id=str(item.call_id), output=_clip(_result_text(data)))]
    if item.type == "command_execution":
        arguments = data.get("arguments") or json.dumps({"command": data.get("command")})
        call: list[InputItem] = [FunctionCallInput(call_id=str(item.call_id), name="shell", arguments=str(arguments))]
        if item.status == "in_progress":
            return call
        exit_code = data.get("exit_code")
        header = f"exit_code: {exit_code}" if exit_code is not None else f"status: {item.status}"
        return [*call, FunctionCallOutputInput(call_id=str(item.call_id), output=_clip(f"{header}\n{data.get('output') or ''}"))]
    return []

