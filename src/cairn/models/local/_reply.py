"""The one-JSON-object reply format a small local model answers in, and its lenient parser.

A 1.5B model cannot be trusted to follow a tool-calling chat template: unconstrained, its
native template wraps calls in Markdown fences and it loops on the same command. So every
reply is constrained (by a grammar built from `reply_schema`) to exactly one of

    {"thought": "<the next step, and why>", "name": "<tool>", "arguments": {...}}
    {"thought": "<why the work is done>", "name": "final_answer", "arguments": {"text": "<answer>"}}

except that a call to a tool that writes files (it takes a `path` and a string `content`)
gives only the other arguments in its JSON and the content after it, as a Markdown code
block (`fenced_argument`). Inside a JSON string the model wrote worse code: asked to add
a command-line option to a script, it added a parameter and never parsed the option, in
every recorded run; the same request answered as a code block parsed it in 5 of 5 seeds
(docs/local-model.md). A code block is also where a coding model has seen most code, and
it needs no escapes.

The `thought` comes first because it measurably changes the choice that follows: asked
to create and run a script, the model ran the not-yet-existing file, or a system program
of a similar name, in 3 of 5 first steps without it and wrote the file first in 4 of 4
with it; without it, it also answered right after writing the file, never running it.
The answer's text comes last, so it can be streamed while it is generated
(`_answer_stream`). The parser still accepts what a constraint cannot rule out or a
cut-off generation leaves behind: Markdown fences, trailing text, `arguments` given as a
JSON string, alternative key names, and a reply truncated by the token limit (closed up
where that is unambiguous).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cairn.models.base import ToolSpec
from cairn.models.local._tool_roles import argument_names, writes_files

__all__ = [
    "FENCED_BODY",
    "FENCED_BODY_GBNF",
    "FINAL_ANSWER",
    "FinalAnswer",
    "ReplyParseError",
    "ToolCallReply",
    "fenced_argument",
    "fenced_arguments",
    "offered_tools",
    "parse_reply",
    "reply_schema",
    "render_reply",
]

FINAL_ANSWER = "final_answer"
# Marks a branch of the reply schema whose call is followed by a code block; its value is
# the argument the block holds. The runtime builds the grammar from it (`_runtime`).
FENCED_BODY = "x-fenced-body"
# The code block after such a call, in llama.cpp's grammar notation: an opening fence with
# an optional language tag, lines that do not start with three backticks (so a file
# cannot hold a line that does), and the closing fence.
FENCED_BODY_GBNF = r"""fenced-body ::= "\n"? "```" [a-zA-Z0-9_+.-]* "\n" fenced-line* "```" "\n"?
fenced-line ::= ([^`\n] [^\n]* | "`" [^`\n] [^\n]* | "``" [^`\n] [^\n]*)? "\n"
"""
_CODE_BLOCK = re.compile(r"\A\s*```[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
# The language named on a code block's fence, by the file's suffix; others get none.
_FENCE_LANGUAGES = {".py": "python", ".sh": "sh", ".js": "javascript", ".json": "json", ".md": "markdown"}

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


def fenced_argument(tool: ToolSpec) -> str | None:
    """The argument a call to `tool` writes as a code block after its JSON, if any.

    That is a file writer's `content`: a tool taking a `path` and a string `content`.
    """
    properties = tool.parameters.get("properties") or {}
    content = properties.get("content")
    if "path" in properties and isinstance(content, Mapping) and content.get("type") == "string":
        return "content"
    return None


def fenced_arguments(tools: Sequence[ToolSpec]) -> dict[str, str]:
    """Tool name -> the argument its calls write as a code block, for the tools that have one."""
    return {tool.name: argument for tool in tools if (argument := fenced_argument(tool)) is not None}


def offered_tools(tools: Sequence[ToolSpec]) -> list[ToolSpec]:
    """The tools the model is offered: all of them, except a patch tool next to a file writer.

    Measured in development: every patch the model wrote was malformed (it filled the
    patch format's placeholders with a file name in parentheses), each costing a step, while
    it writes whole files correctly. So when a tool writes whole files (it takes a `path`
    and a `content`), a tool whose only argument is a `patch` is left out.
    """
    if not any(writes_files(tool) for tool in tools):
        return list(tools)
    return [tool for tool in tools if argument_names(tool) != {"patch"}]


# A path is one line of plain characters: no escapes, so no newline inside it. Measured: with
# the file writer offered first, the model wrote `"path": "hello.py\nprint('hello')"`, the
# file's content inside its name.
_PATH_PATTERN = r'^[^"\\\n\t]+$'


def _single_line_paths(properties: Mapping[str, Any]) -> dict[str, Any]:
    """`properties` with every string argument named `path` limited to `_PATH_PATTERN`."""
    limited = dict(properties)
    path = limited.get("path")
    if isinstance(path, Mapping) and path.get("type") == "string" and "pattern" not in path:
        limited["path"] = {**path, "pattern": _PATH_PATTERN}
    return limited


def _object_schema(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A tool's parameters, closed to extra keys unless the tool says otherwise.

    Open objects let the grammar admit any key, which a small model uses to wander off.
    """
    schema = dict(parameters) if parameters else {}
    schema.setdefault("type", "object")
    schema["properties"] = _single_line_paths(offered_properties(schema))
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


def _tool_branch(tool: ToolSpec) -> dict[str, Any]:
    arguments = _object_schema(tool.parameters)
    fenced = fenced_argument(tool)
    if fenced is None:
        return _branch(tool.name, arguments)
    arguments["properties"] = {k: v for k, v in arguments["properties"].items() if k != fenced}
    if "required" in arguments:
        arguments["required"] = [k for k in arguments["required"] if k != fenced]
    return {**_branch(tool.name, arguments), FENCED_BODY: fenced}


def reply_schema(tools: Sequence[ToolSpec], *, allow_tools: bool = True, allow_answer: bool = True) -> dict[str, Any]:
    """The JSON schema with one branch per tool plus the final answer.

    A file writer's branch leaves its content out and is marked with `FENCED_BODY`: the
    content is the code block that follows the JSON (see the module docstring).

    `allow_tools=False` leaves only the final answer: the repeat guard uses it to make a
    model that keeps repeating itself stop and answer. `allow_answer=False` leaves only
    the tools, when the request visibly is not done; it is ignored without tools.
    """
    branches = [_tool_branch(t) for t in tools] if allow_tools else []
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


def render_reply(reply: FinalAnswer | ToolCallReply, fenced: str | None = None) -> str:
    """The exact text the model would have produced for `reply`, for its own history.

    `fenced` names the argument the call's tool takes as a code block (`fenced_argument`).
    """
    if isinstance(reply, FinalAnswer):
        # An answer's thought is not kept (only its text is stored), so none is shown.
        return json.dumps({"name": FINAL_ANSWER, "arguments": {"text": reply.text}}, ensure_ascii=False)
    thought = {"thought": reply.thought} if reply.thought else {}
    arguments = dict(reply.arguments)
    body = arguments.pop(fenced, None) if fenced else None
    if not isinstance(body, str):
        return json.dumps({**thought, "name": reply.name, "arguments": dict(reply.arguments)}, ensure_ascii=False)
    head = json.dumps({**thought, "name": reply.name, "arguments": arguments}, ensure_ascii=False)
    suffix = "." + str(arguments.get("path", "")).rsplit(".", 1)[-1].lower()
    if body and not body.endswith("\n"):
        body += "\n"
    return f"{head}\n```{_FENCE_LANGUAGES.get(suffix, '')}\n{body}```"


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


def _load_object(raw: str) -> tuple[dict[str, Any], str]:
    """The reply's JSON object and the text after it (where a code block may follow)."""
    text = raw.strip()
    if text.startswith("```"):  # the whole reply fenced, as a chat model likes to
        text = _FENCE.sub("", text)
    start = text.find("{")
    if start < 0:
        raise ReplyParseError("the reply contains no JSON object")
    text = text[start:]
    # strict=False: the grammar lets raw newlines and tabs into strings, and a model's
    # multi-line file content is meant exactly as written.
    decoder = json.JSONDecoder(strict=False)
    try:
        value, end = decoder.raw_decode(text)
    except json.JSONDecodeError:
        try:
            value, _ = decoder.raw_decode(_close_truncated(text))
            end = len(text)
        except json.JSONDecodeError as exc:
            raise ReplyParseError(f"the reply is not JSON, even closed up: {exc}") from exc
    if not isinstance(value, dict):
        raise ReplyParseError("the reply is JSON but not an object")
    return value, text[end:]


def _code_block(rest: str) -> str | None:
    """The content of the code block that `rest` starts with, or None if there is none."""
    match = _CODE_BLOCK.match(rest)
    return match.group(1) if match else None


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


def parse_reply(
    raw: str, tool_names: Sequence[str], fenced: Mapping[str, str] | None = None
) -> FinalAnswer | ToolCallReply:
    """Read one reply leniently; raise `ReplyParseError` when no reading is unambiguous.

    `fenced` maps a tool to the argument its calls give as a code block after the JSON.
    """
    obj, rest = _load_object(raw)
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
    arguments = _arguments(_first(obj, _ARGUMENT_KEYS))
    argument = (fenced or {}).get(matches[0])
    if argument is not None and argument not in arguments:
        body = _code_block(rest)
        if body is None:
            raise ReplyParseError(f"the call to {matches[0]!r} has no complete code block after its JSON")
        arguments[argument] = body
    return ToolCallReply(matches[0], arguments, thought.strip() if isinstance(thought, str) else "")
