"""The local model's reply format: the constraint schema and the lenient parser."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from cairn.models.base import ToolSpec
from cairn.models.local._reply import (
    FENCED_BODY,
    FINAL_ANSWER,
    FinalAnswer,
    ReplyParseError,
    ToolCallReply,
    fenced_argument,
    parse_reply,
    render_reply,
    reply_schema,
)

EXEC = ToolSpec(
    name="exec_command",
    description="Run a shell command.",
    parameters={"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    kind="workspace",
)
WRITE = ToolSpec(
    name="write_file",
    description="Write a file.",
    parameters={
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
    kind="workspace",
)
NAMES = ["exec_command", "write_file"]
FENCED = {"write_file": "content"}


def _branch_names(schema: dict[str, Any]) -> list[str]:
    return [branch["properties"]["name"]["const"] for branch in schema["oneOf"]]


def test_schema_has_one_branch_per_tool_plus_final_answer() -> None:
    schema = reply_schema([EXEC, WRITE])
    assert _branch_names(schema) == ["exec_command", "write_file", FINAL_ANSWER]
    for branch in schema["oneOf"]:
        # Think, then choose; the answer's text comes last, so it can stream.
        assert list(branch["properties"]) == ["thought", "name", "arguments"]
        assert branch["required"] == ["thought", "name", "arguments"]
        assert branch["additionalProperties"] is False


def test_schema_closes_tool_arguments_to_extra_keys_unless_the_tool_opens_them() -> None:
    open_tool = ToolSpec("t", "d", {"type": "object", "additionalProperties": True}, "client")
    schema = reply_schema([EXEC, open_tool])
    assert schema["oneOf"][0]["properties"]["arguments"]["additionalProperties"] is False
    assert schema["oneOf"][1]["properties"]["arguments"]["additionalProperties"] is True
    assert EXEC.parameters.get("additionalProperties") is None  # the tool's own schema is untouched


def test_schema_gives_a_tool_without_parameters_an_empty_object() -> None:
    schema = reply_schema([ToolSpec("now", "the time", {}, "client")])
    arguments = schema["oneOf"][0]["properties"]["arguments"]
    assert arguments == {"type": "object", "properties": {}, "additionalProperties": False}


def test_answer_only_schema_for_the_repeat_guard() -> None:
    assert _branch_names(reply_schema([EXEC, WRITE], allow_tools=False)) == [FINAL_ANSWER]


def test_parses_a_tool_call_and_its_thought() -> None:
    raw = '{"thought": " Run the script. ", "name": "exec_command", "arguments": {"cmd": "python main.py"}}'
    assert parse_reply(raw, NAMES) == ToolCallReply("exec_command", {"cmd": "python main.py"}, "Run the script.")


def test_a_call_without_a_thought_is_still_a_call() -> None:
    raw = '{"name": "exec_command", "arguments": {"cmd": "ls"}, "thought": 3}'
    assert parse_reply(raw, NAMES) == ToolCallReply("exec_command", {"cmd": "ls"}, "")


def test_parses_a_final_answer() -> None:
    raw = '{"name": "final_answer", "arguments": {"text": "Done.\\nOutput: ."}}'
    assert parse_reply(raw, NAMES) == FinalAnswer("Done.\nOutput: .")


@pytest.mark.parametrize(
    "raw",
    [
        '```json\n{"name": "exec_command", "arguments": {"cmd": "ls"}}\n```',
        'Sure:\n{"name": "exec_command", "arguments": {"cmd": "ls"}} and then more',
        '{"name": "exec_command", "arguments": "{\\"cmd\\": \\"ls\\"}"}',
        '{"tool": "exec_command", "args": {"cmd": "ls"}}',
        '{"name": "Exec-Command", "arguments": {"cmd": "ls"}}',
    ],
)
def test_reads_tool_calls_leniently(raw: str) -> None:
    assert parse_reply(raw, NAMES) == ToolCallReply("exec_command", {"cmd": "ls"})


@pytest.mark.parametrize(
    "raw",
    [
        '{"name": "final_answer", "arguments": "all done"}',
        '{"name": "final_answer", "arguments": {"answer": "all done"}}',
        '{"name": "final_answer", "text": "all done"}',
        '{"name": "answer", "arguments": {"text": "all done"}}',
    ],
)
def test_reads_final_answers_leniently(raw: str) -> None:
    assert parse_reply(raw, NAMES) == FinalAnswer("all done")


def test_closes_a_final_answer_cut_off_by_the_token_limit() -> None:
    raw = '{"name": "final_answer", "arguments": {"text": "The listing is:\\n.\\n├── a'
    assert parse_reply(raw, NAMES) == FinalAnswer("The listing is:\n.\n├── a")


@pytest.mark.parametrize("cut", ['"a\\', '"a\\u00', '"a'])
def test_closes_a_string_cut_inside_an_escape(cut: str) -> None:
    raw = '{"name": "final_answer", "arguments": {"text": ' + cut
    assert parse_reply(raw, NAMES) == FinalAnswer("a")


def test_closes_a_tool_call_cut_after_a_value() -> None:
    raw = '{"name": "write_file", "arguments": {"path": "x.py", "content": "print(1)\\n'
    assert parse_reply(raw, NAMES) == ToolCallReply("write_file", {"path": "x.py", "content": "print(1)\n"})


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("I will list the files.", "no JSON object"),
        ('{"name": "rm_everything", "arguments": {}}', "not one of the offered tools"),
        ('{"arguments": {"cmd": "ls"}}', "names no tool"),
        ('{"name": "exec_command", "arguments": [1]}', "not an object"),
        ('{"name": "exec_command", "arguments": "ls -la"}', "not JSON"),
        ('{"name": "final_answer", "arguments": {"text": 3}}', "no text"),
        ('{"name": "exec_command", "argu', "not JSON"),
    ],
)
def test_refuses_what_has_no_unambiguous_reading(raw: str, reason: str) -> None:
    with pytest.raises(ReplyParseError, match=reason):
        parse_reply(raw, NAMES)


def test_a_tool_is_not_callable_when_it_was_not_offered() -> None:
    with pytest.raises(ReplyParseError):
        parse_reply('{"name": "exec_command", "arguments": {"cmd": "ls"}}', [])


@pytest.mark.parametrize(
    "reply",
    [
        FinalAnswer('say "hi"\n'),
        ToolCallReply("write_file", {"path": "t.py", "content": "é\n"}),
        ToolCallReply("write_file", {"path": "t.py", "content": ""}, "Write it first."),
    ],
)
def test_render_reply_round_trips(reply: FinalAnswer | ToolCallReply) -> None:
    rendered = render_reply(reply)
    assert json.loads(rendered)["name"] in (FINAL_ANSWER, "write_file")
    assert parse_reply(rendered, NAMES) == reply


def test_accepts_raw_newlines_inside_strings_which_the_grammar_allows() -> None:
    raw = '{"name": "write_file", "arguments": {"path": "t.py", "content": "import os\n\tprint(1)\n"}}'
    assert parse_reply(raw, NAMES) == ToolCallReply("write_file", {"path": "t.py", "content": "import os\n\tprint(1)\n"})


def test_optional_arguments_are_left_out_of_the_grammar() -> None:
    tool = ToolSpec(
        "shell",
        "d",
        {"type": "object", "properties": {"command": {"type": "string"}, "timeout_ms": {"type": "integer"}}, "required": ["command"]},
        "workspace",
    )
    arguments = reply_schema([tool])["oneOf"][0]["properties"]["arguments"]
    assert list(arguments["properties"]) == ["command"]
    assert arguments["required"] == ["command"]


def test_without_the_answer_only_the_tools_remain() -> None:
    tool = ToolSpec("shell", "Run.", {"type": "object", "properties": {"command": {"type": "string"}}}, "workspace")
    names = [b["properties"]["name"]["const"] for b in reply_schema([tool], allow_answer=False)["oneOf"]]
    assert names == ["shell"]
    # With no tool to call, the answer stays: a reply must always be possible.
    only = reply_schema([tool], allow_tools=False, allow_answer=False)["oneOf"]
    assert [b["properties"]["name"]["const"] for b in only] == ["final_answer"]


def test_a_file_writers_content_is_left_out_of_its_json_and_marked_as_the_code_block() -> None:
    [write, _] = reply_schema([WRITE])["oneOf"]
    arguments = write["properties"]["arguments"]
    assert list(arguments["properties"]) == ["path"] and arguments["required"] == ["path"]
    assert write[FENCED_BODY] == "content"
    assert FENCED_BODY not in reply_schema([EXEC])["oneOf"][0]
    assert fenced_argument(WRITE) == "content" and fenced_argument(EXEC) is None


def test_a_file_writers_content_is_read_from_the_code_block_after_the_call() -> None:
    raw = '{"thought": "Write it.", "name": "write_file", "arguments": {"path": "t.py"}}\n```python\nprint("a\\nb")\n\n```\n'
    assert parse_reply(raw, NAMES, FENCED) == ToolCallReply("write_file", {"path": "t.py", "content": 'print("a\\nb")\n\n'}, "Write it.")
    empty = '{"thought": "", "name": "write_file", "arguments": {"path": "e.txt"}}```\n```'
    assert parse_reply(empty, NAMES, FENCED).arguments["content"] == ""


def test_a_file_writers_call_without_a_closed_code_block_is_refused() -> None:
    with pytest.raises(ReplyParseError, match="no complete code block"):
        parse_reply('{"name": "write_file", "arguments": {"path": "t.py"}}\n```python\nprint(1)\n', NAMES, FENCED)


@pytest.mark.parametrize("content", ["import os\n\nprint(os.sep)\n", "", 'x = "```"\n'])
def test_a_file_writers_call_round_trips_through_its_code_block(content: str) -> None:
    reply = ToolCallReply("write_file", {"path": "t.py", "content": content}, "Write it.")
    rendered = render_reply(reply, "content")
    assert rendered.split("\n", 1)[1].startswith("```python\n")
    assert parse_reply(rendered, NAMES, FENCED) == reply


def test_a_path_argument_is_one_line_without_escapes() -> None:
    [write, _] = reply_schema([WRITE])["oneOf"]
    pattern = write["properties"]["arguments"]["properties"]["path"]["pattern"]
    # The grammar matches the pattern against the JSON text between the quotes.
    matches = re.compile(pattern).fullmatch
    assert matches("dist/main.py") and matches("src/pkg/core.py") and matches("données/é.txt")
    assert not matches(r"hello.py\nprint('hello')") and not matches('a"b') and not matches("a\nb")
    own = ToolSpec("t", "d", {"type": "object", "properties": {"path": {"type": "string", "pattern": "^x$"}}}, "client")
    assert reply_schema([own])["oneOf"][0]["properties"]["arguments"]["properties"]["path"]["pattern"] == "^x$"
    assert "pattern" not in WRITE.parameters["properties"]["path"]  # the tool's own schema is untouched
