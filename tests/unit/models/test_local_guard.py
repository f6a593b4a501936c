"""Repeat detection for the local model's tool calls."""

from __future__ import annotations

from cairn.models._local_guard import call_key, turn_calls
from cairn.models.base import FunctionCallInput, FunctionCallOutputInput, InputItem, MessageInput


def _call(cmd: str, n: int) -> list[InputItem]:
    return [
        FunctionCallInput(f"c{n}", "exec_command", f'{{"cmd": "{cmd}"}}'),
        FunctionCallOutputInput(f"c{n}", "output"),
    ]


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
    assert not calls.is_repeat(call_key("exec_command", {"cmd": "ls"}))  # that was another turn
    assert calls.is_repeat(call_key("exec_command", {"cmd": "pwd"}))


def test_repeating_the_previous_call_is_a_repeat() -> None:
    calls = turn_calls([MessageInput("user", "go"), *_call("python tree.py", 1)])
    assert calls.is_repeat(call_key("exec_command", {"cmd": "python tree.py"}))


def test_running_again_after_another_call_is_allowed_once() -> None:
    # run, fix, run again: a legitimate pattern
    items = [MessageInput("user", "go"), *_call("python t.py", 1), *_call("sed -i s/a/b/ t.py", 2)]
    assert not turn_calls(items).is_repeat(call_key("exec_command", {"cmd": "python t.py"}))


def test_a_third_identical_call_in_a_loop_is_a_repeat() -> None:
    items = [
        MessageInput("user", "go"),
        *_call("python t.py", 1),
        *_call("cat t.py", 2),
        *_call("python t.py", 3),
        *_call("cat t.py", 4),
    ]
    assert turn_calls(items).is_repeat(call_key("exec_command", {"cmd": "python t.py"}))


def test_whitespace_and_key_order_do_not_hide_a_repeat() -> None:
    assert call_key("w", {"path": "a", "content": "x  y"}) == call_key("w", '{"content": "x y", "path": "a"}')
    assert call_key("w", {"path": "a"}) != call_key("other", {"path": "a"})


def test_arguments_that_are_not_json_still_have_a_key() -> None:
    assert call_key("w", "not  json") == call_key("w", "not json")


def test_a_turn_without_calls_repeats_nothing() -> None:
    calls = turn_calls([MessageInput("user", "hi")])
    assert len(calls) == 0
    assert not calls.is_repeat(call_key("exec_command", {"cmd": "ls"}))
