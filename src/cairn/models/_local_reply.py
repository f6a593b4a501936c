"""The one-JSON-object reply format a small local model answers in, and its lenient parser.

A 1.5B model cannot be trusted to follow a tool-calling chat template: unconstrained, its
native template wraps calls in Markdown fences and it loops on the same command. So every
reply is constrained (by a grammar built from `reply_schema`) to exactly one of

    {"thought": "<the next step, and why>", "name": "<tool>", "arguments": {...}}
    {"thought": "<why the work is done>", "name": "final_answer", "arguments": {"text": "<answer>"}}

The `thought` comes first because it measurably changes the choice that follows: asked
to create and run a script, the model ran the not-yet-existing file or a `tree` binary in
3 of 5 first steps without it and wrote the file first in 4 of 4 with it; without it, it
also answered right after writing the file, never running it. The answer's text comes
last, so it can be streamed while it is generated (`_local_answer_stream`). The parser still accepts what a
constraint cannot rule out or a cut-off generation leaves behind: Markdown fences,
trailing text, `arguments` given as a JSON string, alternative key names, and a reply
truncated by the token limit (closed up where that is unambiguous).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cairn.models.base import ToolSpec

__all__ = [
    "FINAL_ANSWER",
    "FinalAnswer",
    "ReplyParseError",
    "ToolCallReply",
    "offered_tools",
    "parse_reply",
    "reply_schema",
    "render_reply",
]

FINAL_ANSWER = "final_answer"

_NAME_KEYS = ("name", "tool", "function")
_ARGUMENT_KEYS = ("arguments", "args", "parameters", "input")
_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```\s*$")


@dataclass(frozen=True, slots=True)
class FinalAnswer:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallReply:
    name: str
    arguments: Mapping[str, Any]
    thought: str = ""


class ReplyParseError(ValueError):
    """The model's output is not a reply in the expected format, even read leniently."""


def offered_properties(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments the model may give: the required ones, when the tool says which.

    Optional arguments are left to their defaults. Offered them, the model filled in
    `timeout_ms` on most shell calls, once with 0, which the tool rejected.
    """
    properties = dict(parameters.get("properties") or {})
    if "required" not in parameters:
        return properties
    required = set(parameters["required"])
    return {name: schema for name, schema in properties.items() if name in required}


def _argument_names(tool: ToolSpec) -> set[str]:
    return set((tool.parameters.get("properties") or {}).keys())


def offered_tools(tools: Sequence[ToolSpec]) -> list[ToolSpec]:
    """The tools the model is offered: all of them, except a patch tool next to a file writer.

    Measured on the tree.py tutorial: every patch the model wrote was malformed (it
    filled the patch format's placeholders with "(tree.py)"), each costing a step, while it
    writes whole files correctly. So when a tool writes whole files (it takes a `path`
    and a `content`), a tool whose only argument is a `patch` is left out.
    """
    if not any({"path", "content"} <= _argument_names(tool) for tool in tools):
        return list(tools)
    return [tool for tool in tools if _argument_names(tool) != {"patch"}]


def _object_schema(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A tool's parameters, closed to extra keys unless the tool says otherwise.

    Open objects let the grammar admit any key, which a small model uses to wander off.
    """
    schema = dict(parameters) if parameters else {}
    schema.setdefault("type", "object")
    schema["properties"] = offered_properties(schema)
    schema.setdefault("additionalProperties", False)
    return schema


def _branch(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    properties = {"thought": {"type": "string"}, "name": {"const": name}, "arguments": arguments}
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def reply_schema(tools: Sequence[ToolSpec], *, allow_tools: bool = True, allow_answer: bool = True) -> dict[str, Any]:
    """The JSON schema with one branch per tool plus the final answer.

    `allow_tools=False` leaves only the final answer: the repeat guard uses it to make a
    model that keeps repeating itself stop and answer. `allow_answer=False` leaves only
    the tools, when the request visibly is not done; it is ignored without tools.
    """
    branches = [_branch(t.name, _object_schema(t.parameters)) for t in tools] if allow_tools else []
    if branches and not allow_answer:
        return {"oneOf": branches}
    answer = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    branches.append(_branch(FINAL_ANSWER, answer))
    return {"oneOf": branches}


def render_reply(reply: FinalAnswer | ToolCallReply) -> str:
    """The exact text the model would have produced for `reply`, for its own history."""
    if isinstance(reply, FinalAnswer):
        # An answer's thought is not kept (only its text is stored), so none is shown.
        return json.dumps({"name": FINAL_ANSWER, "arguments": {"text": reply.text}}, ensure_ascii=False)
    thought = {"thought": reply.thought} if reply.thought else {}
    return json.dumps({**thought, "name": reply.name, "arguments": dict(reply.arguments)}, ensure_ascii=False)


def _close_truncated(text: str) -> str:
    """Close the strings, arrays and objects left open by a generation that hit its limit."""
    stack: list[str] = []
    in_string = False
    escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    if in_string:
        if escaped:
            text = text[:-1]
        # A half-written \uXXXX escape cannot be closed; drop it.
        text = re.sub(r"\\u[0-9a-fA-F]{0,3}$", "", text) + '"'
    text = text.rstrip()
    if text.endswith(","):
        text = text[:-1]
    elif text.endswith(":"):
        text += " null"
    return text + "".join(reversed(stack))


def _load_object(raw: str) -> dict[str, Any]:
    text = _FENCE.sub("", raw.strip())
    start = text.find("{")
    if start < 0:
        raise ReplyParseError("the reply contains no JSON object")
    text = text[start:]
    # strict=False: the grammar lets raw newlines and tabs into strings, and a model's
    # multi-line file content is meant exactly as written.
    decoder = json.JSONDecoder(strict=False)
    try:
        value, _ = decoder.raw_decode(text)  # ignores anything after the object
    except json.JSONDecodeError:
        try:
            value, _ = decoder.raw_decode(_close_truncated(text))
        except json.JSONDecodeError as exc:
            raise ReplyParseError(f"the reply is not JSON, even closed up: {exc}") from exc
    if not isinstance(value, dict):
        raise ReplyParseError("the reply is JSON but not an object")
    return value


def _first(obj: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for key in keys:
        if key in obj:
            return obj[key]
    return None


def _normalize(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _arguments(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value, strict=False)
        except json.JSONDecodeError as exc:
            raise ReplyParseError("`arguments` is a string that is not JSON") from exc
    if not isinstance(value, dict):
        raise ReplyParseError("`arguments` is not an object")
    return value


def parse_reply(raw: str, tool_names: Sequence[str]) -> FinalAnswer | ToolCallReply:
    """Read one reply leniently; raise `ReplyParseError` when no reading is unambiguous."""
    obj = _load_object(raw)
    name = _first(obj, _NAME_KEYS)
    if not isinstance(name, str):
        raise ReplyParseError("the reply names no tool")
    wanted = _normalize(name)
    if wanted in (_normalize(FINAL_ANSWER), "answer", "final"):
        args = _first(obj, _ARGUMENT_KEYS)
        if isinstance(args, str):
            return FinalAnswer(args)
        text = _first(_arguments(args), ("text", "answer", "content")) if args is not None else None
        if text is None:
            text = _first(obj, ("text", "answer", "content"))
        if not isinstance(text, str):
            raise ReplyParseError("the final answer has no text")
        return FinalAnswer(text)
    matches = [t for t in tool_names if _normalize(t) == wanted]
    if len(matches) != 1:
        raise ReplyParseError(f"the reply calls {name!r}, which is not one of the offered tools")
    thought = obj.get("thought")
    return ToolCallReply(
        matches[0], _arguments(_first(obj, _ARGUMENT_KEYS)), thought.strip() if isinstance(thought, str) else ""
    )
