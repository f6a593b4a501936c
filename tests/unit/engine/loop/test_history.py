"""How stored items become the model's input."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from cairn.engine.loop.history import History
from cairn.engine.tools.client import client_tool_specs
from cairn.models.base import FunctionCallInput, FunctionCallOutputInput, MessageInput
from cairn.store.items import ItemRecord

_ids = itertools.count()


def _item(type_: str, data: dict[str, Any], status: str | None = "completed", call_id: str | None = None) -> ItemRecord:
    return ItemRecord(id=f"item_{next(_ids)}", session_id="s", turn_id="t", type=type_, status=status, call_id=call_id, tool_kind=None,
                      output_index=None, data=data, created_at=0.0)


def test_conversation_items_map_to_model_input() -> None:
    items = [
        _item("message", {"role": "user", "content": [{"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": "u"}]}),
        _item("command_execution", {"command": "ls", "arguments": '{"command": "ls"}', "output": "a\n", "exit_code": 0}, call_id="c1"),
        _item("function_call", {"name": "get", "arguments": "{}"}, call_id="c2"),
        _item("function_call_output", {"error": "boom"}, call_id="c2"),
        _item("message", {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]}),
        _item("command_execution", {"command": "sleep 9", "output": ""}, status="in_progress", call_id="c3"),
    ]
    assert History(items).model_input() == [
        MessageInput(role="user", text="hi\n[image]"),
        FunctionCallInput(call_id="c1", name="shell", arguments='{"command": "ls"}'),
        FunctionCallOutputInput(call_id="c1", output="exit_code: 0\na\n"),
        FunctionCallInput(call_id="c2", name="get", arguments="{}"),
        FunctionCallOutputInput(call_id="c2", output="error: boom"),
        MessageInput(role="assistant", text="done"),
        FunctionCallInput(call_id="c3", name="shell", arguments='{"command": "sleep 9"}'),
    ]


def test_long_outputs_are_clipped_head_and_tail() -> None:
    output = "A" * 20_000 + "Z" * 20_000
    clipped = History([_item("function_call_output", {"output": output}, call_id="c")]).model_input()[0]
    assert isinstance(clipped, FunctionCallOutputInput)
    assert clipped.output.startswith("A") and clipped.output.endswith("Z") and "omitted" in clipped.output
    assert len(clipped.output) < 17_000


def test_only_function_tools_become_client_tools() -> None:
    specs = client_tool_specs({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}, {"type": "other"}]})
    assert [(s.name, s.kind) for s in specs] == [("f", "client")]


def test_a_replaced_item_changes_the_model_input_and_the_open_calls() -> None:
    running = _item("command_execution", {"command": "ls", "output": ""}, status="in_progress", call_id="c1")
    other_turn = dataclasses.replace(_item("function_call", {"name": "f", "arguments": "{}"}, call_id="c2"), turn_id="t2", status="in_progress", tool_kind="client")
    history = History([running, other_turn])
    running = dataclasses.replace(running, tool_kind="workspace")
    history.remember(running)
    assert history.open_calls("t") == [running]  # the other turn's open call is not this turn's
    assert len(history.model_input()) == 2  # both calls, no output yet

    history.remember(dataclasses.replace(running, status="completed", data={**running.data, "output": "a\n", "exit_code": 0}))
    assert history.open_calls("t") == []
    assert history.model_input()[1] == FunctionCallOutputInput(call_id="c1", output="exit_code: 0\na\n")
    assert len(history.model_input()) == 3


def test_the_model_input_follows_new_and_replaced_items_as_a_fresh_history_would() -> None:
    running = _item("command_execution", {"command": "ls", "output": ""}, status="in_progress", call_id="c1")
    history = History([running])
    kept = history.model_input()
    kept.append(MessageInput(role="user", text="the caller's own copy"))
    message = _item("message", {"role": "user", "content": "next"})
    history.remember(message)
    call = _item("function_call", {"name": "f", "arguments": "{}"}, status="in_progress", call_id="c2")
    history.remember(call)
    history.remember(dataclasses.replace(call, status="completed"))  # same input: nothing to rebuild
    done = dataclasses.replace(running, status="completed", data={**running.data, "output": "a\n", "exit_code": 0})
    history.remember(done)  # an output entry appears in the middle
    assert history.model_input() == History([done, message, dataclasses.replace(call, status="completed")]).model_input()
    assert len(history.model_input()) == 4
