"""Renders a `ModelRequest` as the ChatML prompt Qwen2.5 was tuned on, in Cairn's reply format.

The prompt is built here rather than by llama-cpp-python's chat handlers so that it is
plain, testable text and so that it grows append-only from step to step: llama.cpp then
reuses the evaluated prefix (its KV cache) and a step costs only the new tokens, which
matters at 55-65 prompt tokens/s on two cores.

The model's own earlier steps are rendered in exactly the form it was constrained to
produce (`_reply.render_reply`; a file's content as a code block): a call's thought
comes back from the engine as the assistant message stored just before the call, and is put
back inside it. Tool results are Qwen's `<tool_response>` messages. The preamble is written
for a 1.5B model: short, concrete, one rule a line, with the JSON of a reply shown and a
file's code block described in words (`_FENCED_FORMAT`); it names no particular task.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from cairn.models.base import (
    FunctionCallInput,
    FunctionCallOutputInput,
    MessageInput,
    ModelRequest,
    ToolSpec,
)
from cairn.models.local._reply import (
    FinalAnswer,
    ToolCallReply,
    fenced_argument,
    fenced_arguments,
    offered_properties,
    render_reply,
)
from cairn.models.local._tool_roles import runner_name, writes_files

__all__ = [
    "MAX_TOOL_OUTPUT_CHARS",
    "call_notes",
    "check_turn",
    "render_commands_in_file_reminder",
    "render_empty_file_reminder",
    "render_not_done",
    "render_prompt",
    "render_syntax_reminder",
    "render_tools",
    "render_unchanged_file_reminder",
]

# One command's output can be megabytes; the model only needs its beginning and its end
# (where errors and summaries are), and its context holds a few thousand tokens.
MAX_TOOL_OUTPUT_CHARS = 3000
_HEAD_CHARS = 1000

_DEFAULT_INSTRUCTIONS = "You are a careful coding agent."

_FORMAT = """\
You are an agent: you do the work yourself by calling tools. Describing the work does not \
do it.

Every message you write is exactly one JSON object: either a tool call
{"thought": "<the next unfinished part of the request, and how this call does it>", \
"name": "<tool name>", "arguments": {<the tool's arguments>}}
or, when all the work is done, your answer to the user
{"thought": "<how the tool results show that every part of the request is done>", \
"name": "final_answer", "arguments": {"text": "<your answer>"}}
After each tool call you get its result in a <tool_response> message."""

# No code is shown: with a one-line example program here, the model's next program did
# less than it was asked in 6 of 8 seeds; described in words, in 3 of 16
# (docs/local-model.md). The grammar enforces the layout anyway.
_FENCED_FORMAT = "A {tool} call gives the file's complete content after the JSON object, as a code block."


_RULES = """\
# How to work
- Start every new request with a tool call, never with final_answer.
- Do every part of the request, one tool call at a time, in the order asked.
- A file you are asked to create does not exist yet: write it before you run it.
- To create or change a file, write its complete new content in one call.
{tool_roles}
- Run Python programs with python3 (a command named python may not exist).
- After writing a program, run it and read the output. If it fails, fix the file and run it again.
- Never repeat a call you already made with the same arguments: its result is above.
- Reply with final_answer only when every part of the request is done: say briefly what you \
did and quote the actual output you saw."""


def _tool_roles(tools: Sequence[ToolSpec]) -> str:
    """The rule that keeps commands out of files, naming the tools that play each part.

    Measured: the model wrote `mkdir …` and `cp …` into files with the file-writing tool
    (so the "copied" script was the text of a cp command) while a general rule about "the
    shell tool" was in its prompt; the other way round, asked for hello.py with the shell
    tool offered first, it ran `echo 'print('hello')' > hello.py`, quotes broken. The parts
    are read from the tools' parameters (one takes a command, one a path and content), so
    no tool name is assumed.
    """

    runner, writers = runner_name(tools), [tool.name for tool in tools if writes_files(tool)]
    if runner is not None and writers:
        roles = (
            f"- {' and '.join(writers)} only saves the text you give it into a file; it never runs "
            f"anything. Every command (mkdir, cp, python3, ...) must be run with {runner}. "
            f"Write a program's text with {writers[0]}, never with echo, cat or touch in a command."
        )
    else:
        roles = "- A file's content is never a list of commands to run: run commands with a tool that runs them."
    return roles


def _fenced_format(fenced: Mapping[str, str]) -> str | None:
    """How a file writer's call is written (see `_reply`), if any tool is one (`fenced`:
    `fenced_arguments` of the tools)."""
    writer = next(iter(fenced), None)
    return None if writer is None else _FENCED_FORMAT.format(tool=writer)


def _type_name(schema: Any) -> str:
    if not isinstance(schema, Mapping):
        return "any"
    if "type" in schema:
        return str(schema["type"])
    # Optional fields from pydantic come as anyOf [T, null]; null is implied by "optional".
    options = [_type_name(o) for o in schema.get("anyOf") or () if not (isinstance(o, Mapping) and o.get("type") == "null")]
    return " | ".join(options) or "any"


def _describe_parameters(parameters: Mapping[str, Any], fenced: str | None) -> list[str]:
    properties = offered_properties(parameters)
    required = set(parameters.get("required") or ())
    lines: list[str] = []
    for name, schema in properties.items():
        if name == fenced:
            lines.append(f"- {name}: the code block after the JSON object")
            continue
        kind = _type_name(schema)
        if isinstance(schema, Mapping) and "enum" in schema:
            kind = " | ".join(json.dumps(v) for v in schema["enum"])
        description = schema.get("description", "") if isinstance(schema, Mapping) else ""
        flag = "required" if name in required else "optional"
        lines.append(f"- {name} ({kind}, {flag}){': ' + description if description else ''}")
    return lines


def render_tools(tools: Sequence[ToolSpec]) -> str:
    """The tool section of the system message: name, description and arguments of each."""
    sections = ["# Tools"]
    for tool in tools:
        sections.append(f"## {tool.name}\n{tool.description.strip()}")
        argument_lines = _describe_parameters(tool.parameters, fenced_argument(tool))
        if argument_lines:
            sections.append("Arguments:\n" + "\n".join(argument_lines))
    return "\n".join(sections)


def _clip(output: str) -> str:
    if len(output) <= MAX_TOOL_OUTPUT_CHARS:
        return output
    tail = MAX_TOOL_OUTPUT_CHARS - _HEAD_CHARS
    omitted = len(output) - MAX_TOOL_OUTPUT_CHARS
    return f"{output[:_HEAD_CHARS]}\n[... {omitted} characters omitted ...]\n{output[-tail:]}"


def _message(role: str, text: str) -> str:
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


def _call_text(item: FunctionCallInput, thought: str, fenced: str | None) -> str:
    try:
        arguments = json.loads(item.arguments)
    except json.JSONDecodeError:
        arguments = None
    if isinstance(arguments, dict):
        return render_reply(ToolCallReply(item.name, arguments, thought), fenced)
    # Not an object: show it as the model wrote it rather than invent a structure.
    return json.dumps({"name": item.name, "arguments": item.arguments}, ensure_ascii=False)


# "/bin/sh: 1: python: not found". For a few programs whose usual name differs between
# systems, the note names the one to use (a Debian sandbox has python3 and no python).
_NOT_FOUND = re.compile(r"(?:^|: )([\w.+-]+): (?:command )?not found$", re.MULTILINE)
_USUAL_NAMES = {"python": "python3", "pip": "pip3"}


def call_notes(call: FunctionCallInput, output: str) -> list[str]:
    """What a command's output does not say but the model needs to know, read from the call.

    Shown after the tool's result, and counted by the check: a program that does not exist
    under the name used, but under its usual other name.
    """
    try:
        arguments = json.loads(call.arguments)
    except json.JSONDecodeError:
        return []
    command = arguments.get("command", arguments.get("cmd")) if isinstance(arguments, dict) else None
    if not isinstance(command, str):
        return []
    missing = dict.fromkeys(_NOT_FOUND.findall(output))
    return [f"There is no {name} command here: use {_USUAL_NAMES[name]}." for name in missing if name in _USUAL_NAMES]


def render_prompt(request: ModelRequest, *, reminder: str | None = None) -> str:
    """The full prompt, ending where the assistant's next reply begins.

    `reminder` is a transient user message appended after the history (the repeat guard's
    nudge); it is never part of the stored conversation.
    """
    instructions = (request.instructions or "").strip() or _DEFAULT_INSTRUCTIONS
    fenced = fenced_arguments(request.tools)
    writer_format = _fenced_format(fenced)
    system_parts = [instructions, _FORMAT if writer_format is None else f"{_FORMAT}\n{writer_format}"]
    if request.tools:
        system_parts.append(render_tools(request.tools))
    system_parts.append(_RULES.format(tool_roles=_tool_roles(request.tools)))
    parts = [_message("system", "\n\n".join(system_parts))]
    items = list(request.input)
    calls: dict[str, FunctionCallInput] = {}
    for index, item in enumerate(items):
        following = items[index + 1] if index + 1 < len(items) else None
        previous = items[index - 1] if index > 0 else None
        if isinstance(item, MessageInput):
            if item.role != "assistant":
                parts.append(_message(item.role, item.text))
            elif not isinstance(following, FunctionCallInput):
                parts.append(_message("assistant", render_reply(FinalAnswer(item.text))))
            # else: it is the thought of the call that follows, rendered inside that call.
        elif isinstance(item, FunctionCallInput):
            thought = previous.text if isinstance(previous, MessageInput) and previous.role == "assistant" else ""
            parts.append(_message("assistant", _call_text(item, thought, fenced.get(item.name))))
            calls[item.call_id] = item
        elif isinstance(item, FunctionCallOutputInput):
            call = calls.get(item.call_id)
            notes = call_notes(call, item.output) if call is not None else []
            shown = "".join(f"\nNote: {note}" for note in notes)
            parts.append(_message("user", f"<tool_response>\n{_clip(item.output)}\n</tool_response>{shown}"))
    if reminder:
        parts.append(_message("user", reminder))
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _brief(arguments: str) -> str:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        value = arguments
    if not isinstance(value, dict):
        return " ".join(str(value).split())[:60]
    return ", ".join(f"{k}={' '.join(str(v).split())[:50]}" for k, v in value.items())


def render_commands_in_file_reminder(tool: str, path: str, runner: str | None) -> str:
    """Sends back a call that would save shell commands as the content of a file."""
    run = f"Run commands with {runner} instead" if runner else "Run commands with a tool that runs them"
    return (
        f"Your {tool} call was not run: the content you gave for {path} is shell commands, and "
        f"{tool} only saves text into a file, it runs nothing. {run}, one call per command."
    )


def render_empty_file_reminder(tool: str, path: str) -> str:
    """Sends back a call that would save an empty file (seen: a file meant to hold a program)."""
    return (
        f"Your {tool} call was not run: its code block is empty, so {path} would be an empty file. "
        f"To write the file, call {tool} again with its complete content; if it really must be "
        "empty, call it again the same way."
    )


def render_unchanged_file_reminder(tool: str, path: str) -> str:
    """Sends back a call that would save exactly what the file already holds."""
    return (
        f"Your {tool} call was not run: {path} already holds exactly this content (you wrote it "
        "before), so it would change nothing. If a command failed, change the code that caused "
        "the error; otherwise take the next step of the request."
    )


def render_syntax_reminder(tool: str, path: str, error: str) -> str:
    """Sends back a call that would save a Python file that does not compile, with the error.

    The file is not written; the model's own reply is not in the prompt, so the error's
    line is quoted for it.
    """
    return (
        f"Your {tool} call was not run: the content you gave for {path} is not valid Python.\n"
        f"{error}\n"
        f"Call {tool} again with the complete corrected file."
    )


_EXIT_CODE = re.compile(r"^\s*exit_code: (-?\d+)")
_QUOTED = re.compile(r"`([^`\n]+)`")
# "Run python3 app.py --verbose and report ...": what follows the verb up to the next
# clause. It counts as a command only if its first or second word is a file name or an
# option (`app.py`, `./build.sh`, `-q`), so "run it and show me" and "run the tests with
# pytest" name none.
_RUN_PHRASE = re.compile(r"\b[Rr]un\s+(.+?)(?=\s+(?:and|then|to)\b|[,;:]|\.(?:\s|$)|$)")
_FILE_OR_OPTION = re.compile(r"\S*\w\.\w+|--?\w[\w-]*")
_PYTHON = re.compile(r"\bpython3?\b")
_WORKSPACE_PATH = re.compile(r"/workspace/[\w.\-/]*[\w\-]")
_WORKSPACE_PREFIX = "/workspace/"


def _exit_code(output: str) -> int | None:
    """The exit code at the head of a command's output (Cairn's shell tool format), if any."""
    match = _EXIT_CODE.match(output)
    return int(match.group(1)) if match else None


def _plain(text: str) -> str:
    """Text compared for "was this run / used": no workspace prefix, single spaces, and
    `python` and `python3` alike (a request says `python`, a Debian sandbox has `python3`)."""
    return _PYTHON.sub("python", " ".join(text.replace(_WORKSPACE_PREFIX, "").split()))


def _named_commands(asked: str) -> list[str]:
    """The commands a request asks to run: quoted in backticks, or named after "run"."""
    quoted = [command for command in _QUOTED.findall(asked) if " " in command.strip()]
    unquoted = _QUOTED.sub("", asked)  # a quoted command is not read twice
    named = [
        phrase for phrase in _RUN_PHRASE.findall(unquoted) if any(_FILE_OR_OPTION.fullmatch(w) for w in phrase.split()[:2])
    ]
    return list(dict.fromkeys(quoted + named))


def _unfinished(asked: str, calls: Sequence[tuple[str, str, list[str]]]) -> list[str]:
    """Parts of the request that the turn's calls visibly have not done yet.

    Read from the request's own words, so no task is assumed: a command it names (in
    backticks, or after "run") that no call has run with exit code 0, a /workspace path it
    names that no call has used, and a last command that failed. `calls` are (arguments,
    output, notes) triples; a command with a note (`call_notes`) did not do what it was run for.
    Measured: told only to check, the model answered after a failed run, and without
    ever using a path the request named.
    """
    problems = []
    succeeded = [_plain(arguments) for arguments, output, notes in calls if _exit_code(output) == 0 and not notes]
    for named in _named_commands(asked):
        if not any(_plain(named) in ran for ran in succeeded):
            problems.append(f"`{named}` has not run successfully yet")
    used = [_plain(arguments) for arguments, _, _ in calls]
    for path in dict.fromkeys(_WORKSPACE_PATH.findall(asked)):
        if path.rstrip("/") != "/workspace" and not any(_plain(path) in text for text in used):
            problems.append(f"no tool call has used {path} yet")
    if calls:
        _, last_output, last_notes = calls[-1]
        code = _exit_code(last_output)
        noted = "".join(f" {note}" for note in last_notes)
        if code not in (None, 0):
            lines = [line for line in last_output.splitlines()[1:] if line.strip()]
            error = f": {lines[-1].strip()[:160]}" if lines else ""
            problems.append(f"your last command failed (exit_code {code}){error}.{noted} Fix the cause and run it again")
        elif last_notes:
            problems.append(f"your last command did not do what it was run for:{noted} Fix the cause and run it again")
    return problems


def check_turn(request: ModelRequest) -> tuple[str, list[str]]:
    """The check reminder for the turn so far, and the parts of it visibly not done yet.

    The request and a one-line summary of each call of the turn are repeated right here,
    at the end of the prompt, because a 1.5B model weighs what it read last: told only to
    "check", it answered after writing a file it had never run.
    """
    items = list(request.input)
    start, asked = -1, ""
    for index, item in enumerate(items):
        if isinstance(item, MessageInput) and item.role == "user":
            start, asked = index, item.text
    outputs = {item.call_id: item.output for item in items if isinstance(item, FunctionCallOutputInput)}
    lines = []
    calls: list[tuple[str, str, list[str]]] = []
    for item in items[start + 1 :]:
        if isinstance(item, FunctionCallInput):
            output = outputs.get(item.call_id, "")
            calls.append((item.arguments, output, call_notes(item, output)))
            result = next((line for line in output.splitlines() if line.strip()), "no output")
            lines.append(f"- {item.name}({_brief(item.arguments)}) -> {result[:80]}")
    done = "\n".join(lines) or "- none yet"
    unfinished = _unfinished(asked, calls)
    if unfinished:
        ending = "Do the first part that is not done now, with a tool call."
    else:
        ending = (
            "If any part of the request is not done yet (a file not written, a command not run), "
            "do that part now with a tool call. If every part is done, reply with final_answer "
            "and quote the actual output you saw."
        )
    reminder = (
        "Before you answer, check your work against the request.\n"
        f"The request: {asked}\n"
        f"Your tool calls for it so far:\n{done}"
        + render_not_done(unfinished)
        + "\n"
        + ending
    )
    return reminder, unfinished


def render_not_done(unfinished: Sequence[str]) -> str:
    """The parts `check_turn` found undone, one line each, every line after a line break."""
    return "".join(f"\nNot done yet: {problem}." for problem in unfinished)

