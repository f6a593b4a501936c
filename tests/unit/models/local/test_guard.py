"""Repeat detection for the local model's tool calls."""

from __future__ import annotations

import json
from pathlib import Path

from cairn.models.base import FunctionCallInput, FunctionCallOutputInput, InputItem, MessageInput
from cairn.models.local import _guard
from cairn.models.local._guard import call_key, intent_key, is_looping, turn_calls


def _call(cmd: str, n: int, thought: str = "") -> list[InputItem]:
    return [
        *([MessageInput("assistant", thought)] if thought else []),
        FunctionCallInput(f"c{n}", "exec_command", f'{{"cmd": "{cmd}"}}'),
        FunctionCallOutputInput(f"c{n}", "output"),
    ]


def _key(cmd: str) -> tuple[str, str]:
    return call_key("exec_command", {"cmd": cmd})


NO_INTENT = intent_key("exec_command", "")


def test_the_turn_starts_at_the_last_user_message() -> None:
    items: list[InputItem] = [
        MessageInput("user", "first task"),
        *_call("ls", 1),
        MessageInput("assistant", "done"),
        MessageInput("user", "second task"),
        *_call("pwd", 2),
    ]
    calls = turn_calls(items)
    assert len(calls) == 1
    assert not calls.is_repeat(_key("ls"), NO_INTENT)  # that was another turn
    assert calls.is_repeat(_key("pwd"), NO_INTENT)


def test_repeating_the_previous_call_is_a_repeat() -> None:
    calls = turn_calls([MessageInput("user", "go"), *_call("python main.py", 1)])
    assert calls.is_repeat(_key("python main.py"), NO_INTENT)


def test_running_again_after_another_call_is_allowed_once() -> None:
    # run, fix, run again: a legitimate pattern
    items = [MessageInput("user", "go"), *_call("python t.py", 1), *_call("sed -i s/a/b/ t.py", 2)]
    assert not turn_calls(items).is_repeat(_key("python t.py"), NO_INTENT)


def test_a_third_identical_call_in_a_loop_is_a_repeat() -> None:
    items = [
        MessageInput("user", "go"),
        *_call("python t.py", 1),
        *_call("cat t.py", 2),
        *_call("python t.py", 3),
        *_call("cat t.py", 4),
    ]
    assert turn_calls(items).is_repeat(_key("python t.py"), NO_INTENT)


def test_whitespace_and_key_order_do_not_hide_a_repeat() -> None:
    assert call_key("w", {"path": "a", "content": "x  y"}) == call_key("w", '{"content": "x y", "path": "a"}')
    assert call_key("w", {"path": "a"}) != call_key("other", {"path": "a"})


def test_arguments_that_are_not_json_still_have_a_key() -> None:
    assert call_key("w", "not  json") == call_key("w", "not json")


def test_a_turn_without_calls_repeats_nothing() -> None:
    calls = turn_calls([MessageInput("user", "hi")])
    assert len(calls) == 0
    assert not calls.is_repeat(_key("ls"), NO_INTENT)


def test_a_third_call_in_a_row_with_the_same_intent_is_a_repeat() -> None:
    thought = "Create a few files."
    items = [MessageInput("user", "go"), *_call("touch a", 1, thought), *_call("touch b", 2, thought)]
    calls = turn_calls(items)
    assert calls.is_repeat(_key("touch c"), intent_key("exec_command", "  create a FEW files. "))
    assert not calls.is_repeat(_key("touch c"), intent_key("exec_command", "Now run the script."))
    assert not calls.is_repeat(_key("touch c"), intent_key("other_tool", thought))


def test_a_thought_that_only_counts_up_keeps_its_intent() -> None:
    items = [
        MessageInput("user", "go"),
        *_call("run --limit 2", 1, "Run it with --limit 2."),
        *_call("run --limit 3", 2, "Run it with --limit 3."),
    ]
    calls = turn_calls(items)
    assert calls.is_repeat(_key("run --limit 4"), intent_key("exec_command", "Run it with --limit 4."))
    assert not calls.is_repeat(_key("cp a b"), intent_key("exec_command", "Copy it."))


def test_two_calls_with_the_same_intent_are_fine() -> None:
    thought = "Create a few files."
    calls = turn_calls([MessageInput("user", "go"), *_call("touch a", 1, thought)])
    assert not calls.is_repeat(_key("touch b"), intent_key("exec_command", thought))


def test_a_reply_stuck_on_one_block_is_looping() -> None:
    assert is_looping('{"content": "' + "print('x')\n" * 40)
    assert is_looping("ab" * 200)
    assert not is_looping("short " * 10)


def test_ordinary_code_is_not_looping() -> None:
    code = Path(__file__).read_text()  # this module: repetitive test code, but no loop
    assert not is_looping(code)
    assert not is_looping(Path(_guard.__file__).read_text())


def test_counting_up_is_looping() -> None:
    assert is_looping("".join(f"    data/part{i}\n" for i in range(1, 40)))


def test_the_last_content_written_to_a_path_is_found_however_the_path_is_spelled() -> None:
    def write(n: int, path: str, content: str) -> FunctionCallInput:
        return FunctionCallInput(f"w{n}", "write_file", json.dumps({"path": path, "content": content}))

    items: list[InputItem] = [
        MessageInput("user", "go"),
        write(1, "main.py", "one"),
        write(2, "/workspace/other.py", "other"),
        write(3, "/workspace/main.py", "two"),
        FunctionCallInput("c4", "exec_command", '{"cmd": "cat main.py"}'),
    ]
    saved = _guard.SavedFiles(items)
    assert saved.content_of("./main.py") == "two"
    assert saved.content_of("/workspace/other.py") == "other"
    assert saved.content_of("new.py") is None
