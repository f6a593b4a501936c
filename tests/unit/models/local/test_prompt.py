"""The ChatML prompt the local model reads."""

from __future__ import annotations

import json

from cairn.models.base import (
    FunctionCallInput,
    FunctionCallOutputInput,
    InputItem,
    MessageInput,
    ModelRequest,
    ToolSpec,
)
from cairn.models.local._prompt import (
    MAX_TOOL_OUTPUT_CHARS,
    check_turn,
    render_prompt,
    render_syntax_reminder,
    render_tools,
)

EXEC = ToolSpec(
    name="exec_command",
    description="Run a shell command in the workspace.",
    parameters={
        "type": "object",
        "properties": {
            "cmd": {"type": "string", "description": "the command line"},
            "timeout_s": {"type": "integer"},
            "mode": {"type": "string", "enum": ["fast", "safe"]},
        },
        "required": ["cmd"],
    },
    kind="workspace",
)


def _request(items: list[InputItem], *, instructions: str | None = "Be exact.") -> ModelRequest:
    return ModelRequest("s", "t", 1, len(items), "local:x", instructions, items, [EXEC])


def _check_reminder(request: ModelRequest) -> str:
    return check_turn(request)[0]


def test_tools_are_described_with_their_arguments() -> None:
    text = render_tools([EXEC])
    assert "## exec_command\nRun a shell command in the workspace." in text
    assert "- cmd (string, required): the command line" in text
    assert "timeout_s" not in text  # optional arguments are left to their defaults
    assert "mode" not in text
    no_required = ToolSpec("t", "d", {"type": "object", "properties": {"mode": {"enum": ["a", "b"]}}}, "client")
    assert '- mode ("a" | "b", optional)' in render_tools([no_required])


def test_prompt_is_chatml_ending_at_the_assistant_reply() -> None:
    prompt = render_prompt(_request([MessageInput("user", "List the files.")]))
    assert prompt.startswith("<|im_start|>system\nBe exact.\n\n")
    assert '"name": "final_answer", "arguments": {"text": "<your answer>"}}' in prompt
    assert "<|im_start|>user\nList the files.<|im_end|>\n" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_default_instructions_when_the_agent_has_none() -> None:
    prompt = render_prompt(_request([MessageInput("user", "hi")], instructions="  "))
    assert prompt.startswith("<|im_start|>system\nYou are a careful coding agent.")


def test_history_is_rendered_in_the_reply_format() -> None:
    items: list[InputItem] = [
        MessageInput("user", "Run ls."),
        FunctionCallInput("c1", "exec_command", '{"cmd":"ls"}'),
        FunctionCallOutputInput("c1", "a.py\nb.py"),
        MessageInput("assistant", "There are two files."),
    ]
    prompt = render_prompt(_request(items))
    call = json.dumps({"name": "exec_command", "arguments": {"cmd": "ls"}})
    answer = json.dumps({"name": "final_answer", "arguments": {"text": "There are two files."}})
    assert f"<|im_start|>assistant\n{call}<|im_end|>\n" in prompt
    assert "<|im_start|>user\n<tool_response>\na.py\nb.py\n</tool_response><|im_end|>\n" in prompt
    assert f"<|im_start|>assistant\n{answer}<|im_end|>\n" in prompt


def test_a_calls_thought_is_the_assistant_message_stored_before_it() -> None:
    items: list[InputItem] = [
        MessageInput("user", "Run ls."),
        MessageInput("assistant", "List the files first."),
        FunctionCallInput("c1", "exec_command", '{"cmd": "ls"}'),
        FunctionCallOutputInput("c1", "a.py"),
    ]
    prompt = render_prompt(_request(items))
    call = json.dumps({"thought": "List the files first.", "name": "exec_command", "arguments": {"cmd": "ls"}})
    assert f"<|im_start|>assistant\n{call}<|im_end|>\n" in prompt
    assert "final_answer\", \"arguments\": {\"text\": \"List the files first." not in prompt


def test_arguments_that_are_not_an_object_are_shown_as_written() -> None:
    items: list[InputItem] = [MessageInput("user", "x"), FunctionCallInput("c1", "exec_command", "ls -la")]
    prompt = render_prompt(_request(items))
    assert '{"name": "exec_command", "arguments": "ls -la"}' in prompt


def test_long_tool_output_keeps_its_head_and_tail() -> None:
    output = "HEAD" + "x" * 10_000 + "TAIL"
    items: list[InputItem] = [
        MessageInput("user", "x"),
        FunctionCallInput("c1", "exec_command", '{"cmd": "big"}'),
        FunctionCallOutputInput("c1", output),
    ]
    prompt = render_prompt(_request(items))
    assert "HEAD" in prompt and "TAIL" in prompt
    assert f"[... {len(output) - MAX_TOOL_OUTPUT_CHARS} characters omitted ...]" in prompt
    assert len(prompt) < len(output)


def test_prompt_grows_append_only_from_step_to_step() -> None:
    """Each step's prompt extends the previous one, so llama.cpp reuses its KV cache."""
    first: list[InputItem] = [MessageInput("user", "Run ls.")]
    second = [*first, FunctionCallInput("c1", "exec_command", '{"cmd": "ls"}'), FunctionCallOutputInput("c1", "a")]
    before = render_prompt(_request(first)).removesuffix("<|im_start|>assistant\n")
    assert render_prompt(_request(second)).startswith(before)


def test_reminder_is_the_last_message_before_the_reply() -> None:
    prompt = render_prompt(_request([MessageInput("user", "x")]), reminder="Do not repeat.")
    assert prompt.endswith("<|im_start|>user\nDo not repeat.<|im_end|>\n<|im_start|>assistant\n")


def test_the_check_reminder_repeats_the_request_and_summarizes_the_turns_calls() -> None:
    items: list[InputItem] = [
        MessageInput("user", "Old request."),
        FunctionCallInput("c0", "exec_command", '{"cmd": "old"}'),
        FunctionCallOutputInput("c0", "old"),
        MessageInput("user", "Write t.py and run it."),
        MessageInput("assistant", "Write it first."),
        FunctionCallInput("c1", "write_file", '{"path": "t.py", "content": "print(1)\\nprint(2)"}'),
        FunctionCallOutputInput("c1", "\nwrote 17 bytes to /workspace/t.py"),
    ]
    reminder = _check_reminder(_request(items))
    assert "The request: Write t.py and run it.\n" in reminder
    assert "- write_file(path=t.py, content=print(1) print(2)) -> wrote 17 bytes to /workspace/t.py" in reminder
    assert "old" not in reminder


def test_the_check_reminder_before_any_call() -> None:
    reminder = _check_reminder(_request([MessageInput("user", "Do it.")]))
    assert "so far:\n- none yet\n" in reminder


def test_the_rules_name_the_tool_that_runs_commands_and_the_one_that_writes_files() -> None:
    shell = ToolSpec("shell", "Run.", {"type": "object", "properties": {"command": {"type": "string"}}}, "workspace")
    write = ToolSpec(
        "write_file", "Write.", {"type": "object", "properties": {"path": {}, "content": {}}}, "workspace"
    )
    request = ModelRequest("s", "t", 1, 0, "local:x", None, [MessageInput("user", "x")], [shell, write])
    assert (
        "- write_file only saves the text you give it into a file; it never runs anything. "
        "Every command (mkdir, cp, python3, ...) must be run with shell. "
        "Write a program's text with write_file, never with echo, cat or touch in a command." in render_prompt(request)
    )


def test_without_both_kinds_of_tool_the_rule_stays_general() -> None:
    prompt = render_prompt(_request([MessageInput("user", "x")]))  # exec_command only
    assert "A file's content is never a list of commands to run" in prompt
    assert "as a code block" not in prompt  # no tool writes files


WRITE = ToolSpec(
    "write_file",
    "Write.",
    {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]},
    "workspace",
)


def test_a_file_writers_content_is_described_as_the_code_block_after_the_call() -> None:
    request = ModelRequest("s", "t", 1, 0, "local:x", None, [MessageInput("user", "x")], [WRITE])
    prompt = render_prompt(request)
    assert "\nA write_file call gives the file's complete content after the JSON object, as a code block.\n" in prompt
    assert "- path (string, required)\n- content: the code block after the JSON object" in prompt
    assert "```" not in prompt  # no example program (see _FENCED_FORMAT)


def test_a_written_file_comes_back_as_a_code_block_after_its_call() -> None:
    items: list[InputItem] = [
        MessageInput("user", "x"),
        MessageInput("assistant", "Write it."),
        FunctionCallInput("c1", "write_file", json.dumps({"path": "t.py", "content": 'print("a\\nb")\n'})),
        FunctionCallOutputInput("c1", "wrote 15 bytes"),
    ]
    prompt = render_prompt(ModelRequest("s", "t", 1, 1, "local:x", None, items, [WRITE]))
    call = '{"thought": "Write it.", "name": "write_file", "arguments": {"path": "t.py"}}\n```python\nprint("a\\nb")\n```'
    assert f"<|im_start|>assistant\n{call}<|im_end|>" in prompt


def test_the_syntax_reminder_quotes_the_error() -> None:
    text = render_syntax_reminder("write_file", "main.py", "SyntaxError on line 3: unterminated string literal")
    assert "Your write_file call was not run" in text and "main.py" in text
    assert "SyntaxError on line 3" in text
    assert text.endswith("Call write_file again with the complete corrected file.")


def _turn(asked: str, *calls: tuple[str, str, str]) -> ModelRequest:
    items: list[InputItem] = [MessageInput("user", asked)]
    for n, (name, arguments, output) in enumerate(calls):
        items += [FunctionCallInput(f"c{n}", name, arguments), FunctionCallOutputInput(f"c{n}", output)]
    return _request(items)


ASKED = "Add --count to t.py, run `python3 t.py src --count 1`, then copy it to /workspace/out/t.py."


def test_the_check_reminder_lists_what_the_request_names_and_no_call_has_done() -> None:
    reminder = _check_reminder(
        _turn(
            ASKED,
            ("write_file", '{"path": "/workspace/t.py", "content": "x"}', "wrote 1 bytes"),
            ("shell", '{"command": "python3 /workspace/t.py src --count 1"}', "exit_code: 1\nTraceback\nNameError: x\n"),
        )
    )
    assert "Not done yet: `python3 t.py src --count 1` has not run successfully yet." in reminder
    assert "Not done yet: no tool call has used /workspace/out/t.py yet." in reminder
    assert "Not done yet: your last command failed (exit_code 1): NameError: x. Fix the cause" in reminder


def test_the_check_reminder_names_nothing_when_the_calls_did_it_all() -> None:
    reminder = _check_reminder(
        _turn(
            ASKED,
            ("shell", '{"command": "python3 t.py src --count 1"}', "exit_code: 0\nsrc\n"),
            ("shell", '{"command": "cp t.py /workspace/out/t.py"}', "exit_code: 0\n"),
        )
    )
    assert "Not done yet" not in reminder


def test_a_quoted_word_is_not_taken_for_a_command() -> None:
    reminder = _check_reminder(_turn("Print it like the `ls` command.", ("shell", '{"command": "ls"}', "exit_code: 0\n")))
    assert "Not done yet" not in reminder


def test_a_command_named_after_run_counts_and_python_is_python3() -> None:
    asked = "Add a --verbose option to main.py. Run python main.py --verbose and report the actual output."
    not_run = _check_reminder(_turn(asked, ("shell", '{"command": "python3 main.py"}', "exit_code: 0\n.\n")))
    assert "Not done yet: `python main.py --verbose` has not run successfully yet." in not_run
    ran = _check_reminder(
        _turn(asked, ("shell", '{"command": "python3 /workspace/main.py --verbose"}', "exit_code: 0\n.\n"))
    )
    assert "Not done yet" not in ran


def test_words_after_run_are_a_command_only_if_they_name_a_file_or_an_option() -> None:
    asked = "Create it. Run it and show me the output. Run the tests with pytest, then stop."
    assert "Not done yet" not in _check_reminder(_turn(asked, ("shell", '{"command": "ls"}', "exit_code: 0\n")))


def test_a_program_missing_under_its_usual_other_name_gets_a_note() -> None:
    prompt = render_prompt(_turn("go", ("shell", '{"command": "python main.py"}', "exit_code: 127\n/bin/sh: 1: python: not found\n")))
    assert "</tool_response>\nNote: There is no python command here: use python3.<|im_end|>" in prompt
    other = render_prompt(_turn("go", ("shell", '{"command": "jq ."}', "exit_code: 127\n/bin/sh: 1: jq: not found\n")))
    assert "Note:" not in other


def test_what_a_program_does_with_its_arguments_is_not_judged() -> None:
    """The provider knows the tool protocol, not what the program was meant to do."""
    asked = "Run `python3 main.py --verbose` and report the output."
    request = _turn(
        asked,
        ("write_file", json.dumps({"path": "main.py", "content": "print('hi')\n"}), "wrote 12 bytes"),
        ("shell", '{"command": "python3 main.py --verbose"}', "exit_code: 0\nhi\n"),
    )
    assert "Note:" not in render_prompt(request)
    assert "Not done yet" not in _check_reminder(request)
