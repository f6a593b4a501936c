"""The local provider's orchestration, driven by scripted generations instead of llama.cpp.

The real `Generation` class runs here over a scripted token stream, so the threading,
streaming, repeat guard and error mapping are the production code paths; only the
weights and the llama.cpp model are stood in for.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cairn.errors import InvalidRequestError, ModelError
from cairn.models.base import (
    FunctionCallInput,
    FunctionCallOutputInput,
    InputItem,
    MessageInput,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    TextDelta,
    ToolSpec,
)
from cairn.models.local import LocalModel, create_local_model, local_model_names
from cairn.models.local import _provider as local_module
from cairn.models.local._reply import ToolCallReply, render_reply
from cairn.models.local._runtime import Generation, GenerationSettings
from cairn.models.local._weights import CATALOGUE

pytestmark = pytest.mark.anyio

EXEC = ToolSpec(
    "exec_command",
    "Run a shell command.",
    {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    "workspace",
)


def _call(cmd: str, thought: str = "") -> str:
    return json.dumps({"thought": thought, "name": "exec_command", "arguments": {"cmd": cmd}})


def _answer(text: str) -> str:
    return json.dumps({"name": "final_answer", "arguments": {"text": text}})


def _pieces(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


class ScriptedModel:
    """Stands in for `LoadedModel`: each `open` plays the next scripted reply as tokens."""

    def __init__(self, *replies: str) -> None:
        self.replies = list(replies)
        self.prompts: list[str] = []
        self.schemas: list[dict[str, Any]] = []
        self.releases = 0
        self.decode_threads: set[int] = set()

    def _release(self) -> None:
        self.releases += 1

    def open(self, prompt: str, schema_json: str, settings: GenerationSettings) -> Generation:
        self.prompts.append(prompt)
        self.schemas.append(json.loads(schema_json))
        pieces = [p.encode() for p in _pieces(self.replies.pop(0))]

        def detokenize(token: int) -> bytes:
            self.decode_threads.add(threading.get_ident())
            return pieces[token]

        return Generation(
            iter(range(len(pieces))),
            detokenize,
            frozenset(),
            prompt_tokens=len(prompt),
            max_tokens=settings.max_tokens,
            release=self._release,
        )

    def branch_names(self, attempt: int) -> list[str]:
        return [b["properties"]["name"]["const"] for b in self.schemas[attempt]["oneOf"]]


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., LocalModel]:
    def make(scripted: ScriptedModel, settings: GenerationSettings | None = None) -> LocalModel:
        monkeypatch.setattr(local_module, "find_loaded_model", lambda path: None)
        monkeypatch.setattr(local_module, "materialize_weights", lambda weights, cache: cache / "m.gguf")
        monkeypatch.setattr(local_module, "load_model", lambda path: scripted)
        return LocalModel(CATALOGUE["qwen2.5-coder-1.5b"], tmp_path, settings)

    return make


def _request(items: list[InputItem], tools: list[ToolSpec] | None = None, **kw: Any) -> ModelRequest:
    return ModelRequest("s1", "t1", 1, len(items), "local:qwen2.5-coder-1.5b", "Be exact.", items, [EXEC] if tools is None else tools, **kw)


async def _collect(model: LocalModel, request: ModelRequest) -> tuple[list[str], ModelResponse]:
    deltas: list[str] = []
    response: ModelResponse | None = None
    async for event in model.stream(request):
        if isinstance(event, TextDelta):
            assert response is None, "deltas come before the response"
            deltas.append(event.text)
        else:
            assert response is None, "exactly one response"
            response = event
    assert response is not None
    return deltas, response


async def test_a_tool_call_becomes_one_call_and_no_text(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel(_call("python main.py"))
    deltas, response = await _collect(install(scripted), _request([MessageInput("user", "run it")]))
    assert deltas == []
    assert response.text is None
    [call] = response.tool_calls
    assert (call.name, dict(call.arguments)) == ("exec_command", {"cmd": "python main.py"})
    assert call.call_id.startswith("call_")
    assert scripted.branch_names(0) == ["exec_command", "final_answer"]
    assert scripted.releases == 1


async def test_a_calls_thought_is_sent_as_text_once_the_call_is_kept(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel(_call("ls", "Look first."), _call("pwd", "Then check where I am."))
    deltas, response = await _collect(install(scripted), _request(_after_ls()))
    assert deltas == ["Then check where I am."]  # the repeated call's thought never went out
    assert response.text == "Then check where I am."
    assert [c.arguments["cmd"] for c in response.tool_calls] == ["pwd"]


async def test_the_final_answer_streams_as_it_is_generated(install: Callable[..., LocalModel]) -> None:
    text = 'The output:\n.\n├── main.py\n"done"'
    scripted = ScriptedModel(_answer(text), _answer(text))
    deltas, response = await _collect(install(scripted), _request([MessageInput("user", "go")]))
    assert len(deltas) > 5  # token by token, not one block
    assert "".join(deltas) == response.text == text
    assert response.tool_calls == ()
    assert response.usage.output_tokens > len(_pieces(_answer(text)))  # both attempts count
    assert response.usage.input_tokens > 0


async def test_a_first_move_to_answer_is_stopped_and_checked(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel(_answer("Created main.py."), _call("python main.py", "It is not run yet."))
    deltas, response = await _collect(install(scripted), _request(_after_ls()))
    assert deltas == ["It is not run yet."]  # nothing of the stopped answer went out
    assert "check your work against the request" not in scripted.prompts[0]
    assert "check your work against the request" in scripted.prompts[1]
    assert [c.arguments["cmd"] for c in response.tool_calls] == ["python main.py"]
    assert scripted.releases == 2


async def test_tokens_are_generated_off_the_event_loop_thread(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel(_answer("hello there"), _answer("hello there"))
    await _collect(install(scripted), _request([MessageInput("user", "go")]))
    assert scripted.decode_threads
    assert threading.get_ident() not in scripted.decode_threads


async def test_an_answer_the_stream_could_not_decode_arrives_as_one_delta(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel('{"arguments": {"text": "keys reversed"}, "name": "final_answer"}')
    deltas, response = await _collect(install(scripted), _request([MessageInput("user", "go")]))
    assert deltas == ["keys reversed"]
    assert response.text == "keys reversed"


def _after_ls() -> list[InputItem]:
    return [
        MessageInput("user", "list"),
        FunctionCallInput("c1", "exec_command", '{"cmd": "ls"}'),
        FunctionCallOutputInput("c1", "main.py"),
    ]


async def test_a_repeated_call_is_asked_again_with_a_reminder(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel(_call("ls"), _call("python main.py"))
    _, response = await _collect(install(scripted), _request(_after_ls()))
    assert [c.arguments["cmd"] for c in response.tool_calls] == ["python main.py"]
    assert "Do not repeat it" not in scripted.prompts[0]
    assert "Do not repeat it" in scripted.prompts[1]
    assert scripted.releases == 2


async def test_a_call_repeated_twice_leaves_only_the_answer(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel(_call("ls"), _call("ls"), _answer("The directory holds main.py."))
    deltas, response = await _collect(install(scripted), _request(_after_ls()))
    assert scripted.branch_names(2) == ["final_answer"]
    assert response.text == "The directory holds main.py." == "".join(deltas)
    assert response.usage.output_tokens == sum(len(_pieces(r)) for r in (_call("ls"), _call("ls"), _answer("The directory holds main.py.")))


async def test_a_turn_with_too_many_calls_must_answer(install: Callable[..., LocalModel]) -> None:
    items: list[InputItem] = [MessageInput("user", "go")]
    for n in range(16):
        items += [FunctionCallInput(f"c{n}", "exec_command", f'{{"cmd": "echo {n}"}}'), FunctionCallOutputInput(f"c{n}", str(n))]
    scripted = ScriptedModel(_answer("Stopped."))
    _, response = await _collect(install(scripted), _request(items))
    assert scripted.branch_names(0) == ["final_answer"]
    assert "made many tool calls" in scripted.prompts[0]
    assert response.text == "Stopped."


async def test_without_tools_only_the_answer_is_allowed(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel(_answer("Hi."))
    _, response = await _collect(install(scripted), _request([MessageInput("user", "hi")], tools=[]))
    assert scripted.branch_names(0) == ["final_answer"]
    assert "made many tool calls" not in scripted.prompts[0]
    assert response.text == "Hi."


async def test_a_tool_call_cut_off_by_the_token_limit_is_asked_again(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel(_call("x" * 200), _call("ls", "Shorter."))
    model = install(scripted, GenerationSettings(max_tokens=40))
    deltas, response = await _collect(model, _request([MessageInput("user", "go")]))
    assert deltas == ["Shorter."]
    assert [c.arguments["cmd"] for c in response.tool_calls] == ["ls"]
    assert "got stuck repeating itself" in scripted.prompts[1]


async def test_a_call_cut_off_twice_is_not_used(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel(_call("x" * 200), _call("y" * 200))
    model = install(scripted, GenerationSettings(max_tokens=40))
    with pytest.raises(ModelError) as caught:
        await _collect(model, _request([MessageInput("user", "go")]))
    assert caught.value.code == "max_output_tokens"
    assert scripted.releases == 2


async def test_a_looping_call_is_stopped_early_and_asked_again(install: Callable[..., LocalModel]) -> None:
    looping = _call("echo " + "spam " * 400)
    scripted = ScriptedModel(looping, _call("ls", "Shorter."))
    _, response = await _collect(install(scripted), _request([MessageInput("user", "go")]))
    assert [c.arguments["cmd"] for c in response.tool_calls] == ["ls"]
    first_usage = response.usage.output_tokens - len(_pieces(_call("ls", "Shorter.")))
    assert first_usage < len(_pieces(looping)) / 2  # cut off long before its end


async def test_a_looping_answer_keeps_what_was_sent(install: Callable[..., LocalModel]) -> None:
    looping = _answer("Done. " + "again " * 400)
    scripted = ScriptedModel(looping, looping)
    deltas, response = await _collect(install(scripted), _request([MessageInput("user", "go")]))
    assert response.text == "".join(deltas)
    assert response.text is not None and response.text.startswith("Done. again")
    assert len(response.text) < 1000


async def test_an_answer_cut_off_by_the_token_limit_keeps_what_was_said(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel(_answer("a long answer " * 20), _answer("a long answer " * 20))
    model = install(scripted, GenerationSettings(max_tokens=30))
    deltas, response = await _collect(model, _request([MessageInput("user", "go")]))
    assert response.text == "".join(deltas)
    assert response.text and ("a long answer " * 20).startswith(response.text)


async def test_an_unreadable_reply_is_a_model_error(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel('{"name": "format_disk", "arguments": {}}')
    with pytest.raises(ModelError, match="could not be read"):
        await _collect(install(scripted), _request([MessageInput("user", "go")]))


async def test_a_consumer_that_stops_early_hands_the_model_back(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel(_answer("one two three four five six"), _answer("one two three four five six"))
    stream = install(scripted).stream(_request([MessageInput("user", "go")]))
    async for event in stream:
        assert isinstance(event, TextDelta)
        break
    await stream.aclose()  # type: ignore[attr-defined]
    assert scripted.releases == 2  # the checked attempt, and the one cut short


@pytest.mark.parametrize(
    ("tools", "text_format", "message"),
    [
        ([ToolSpec("final_answer", "d", {}, "client")], None, "reserved"),
        ([EXEC], {"type": "json_schema", "schema": {}}, "structured text formats"),
    ],
)
async def test_requests_it_cannot_honour_are_refused(
    install: Callable[..., LocalModel], tools: list[ToolSpec], text_format: dict[str, Any] | None, message: str
) -> None:
    events: list[ModelEvent] = []
    with pytest.raises(ModelError, match=message) as caught:
        async for event in install(ScriptedModel()).stream(_request([MessageInput("user", "x")], tools, text_format=text_format)):
            events.append(event)
    assert caught.value.code == "invalid_request"
    assert events == []


async def test_a_plain_text_format_is_accepted(install: Callable[..., LocalModel]) -> None:
    _, response = await _collect(install(ScriptedModel(_answer("ok"), _answer("ok"))), _request([MessageInput("user", "x")], text_format={"type": "text"}))
    assert response.text == "ok"


def test_create_local_model_takes_the_name_with_or_without_its_prefix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Creating the provider loads nothing, so the extra need not be installed for this check.
    monkeypatch.setattr(local_module, "is_llama_cpp_installed", lambda: True)
    for name in ("local:qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b"):
        assert isinstance(create_local_model(name, tmp_path), LocalModel)


def test_create_local_model_refuses_unknown_names(tmp_path: Path) -> None:
    for name in ("local:gpt-9", "gpt-9", "openai:qwen2.5-coder-1.5b"):
        with pytest.raises(InvalidRequestError, match="local:qwen2.5-coder-1.5b"):
            create_local_model(name, tmp_path)
    assert local_model_names() == ["local:qwen2.5-coder-1.5b"]


def test_create_local_model_names_the_install_command_without_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(local_module, "is_llama_cpp_installed", lambda: False)
    with pytest.raises(ModelError, match=r"pip install 'cairn\[local\]'"):
        create_local_model("local:qwen2.5-coder-1.5b", tmp_path)


WRITE = ToolSpec(
    "write_file",
    "Save a text file.",
    {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
    "workspace",
)
BROKEN = "def main(:\n    pass\n"


def _write(path: str, content: str, thought: str = "") -> str:
    """A file-writing call as the model writes it: the content as a code block after the JSON."""
    return render_reply(ToolCallReply("write_file", {"path": path, "content": content}, thought), "content")


async def test_python_that_does_not_compile_is_sent_back_once_with_the_error(install: Callable[..., LocalModel]) -> None:
    fixed = "def main():\n    pass\n"
    scripted = ScriptedModel(_write("main.py", BROKEN, "Write it."), _write("main.py", fixed, "Fix it."))
    deltas, response = await _collect(install(scripted), _request([MessageInput("user", "go")], [WRITE, EXEC]))
    assert deltas == ["Fix it."]  # nothing of the refused call went out
    assert response.tool_calls[0].arguments["content"] == fixed
    assert "not valid Python" not in scripted.prompts[0]
    assert "SyntaxError on line 1" in scripted.prompts[1] and "def main(:" in scripted.prompts[1]


async def test_a_second_broken_python_file_goes_through(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel(_write("main.py", BROKEN), _write("main.py", BROKEN + "\n"))
    _, response = await _collect(install(scripted), _request([MessageInput("user", "go")], [WRITE, EXEC]))
    assert response.tool_calls[0].arguments["content"] == BROKEN + "\n"
    assert len(scripted.prompts) == 2  # running it will show the model the error


PATCH = ToolSpec(
    "apply_patch", "Edit files with a patch.",
    {"type": "object", "properties": {"patch": {"type": "string"}}, "required": ["patch"]}, "workspace",
)


async def test_a_patch_tool_is_not_offered_next_to_a_file_writer(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel(_call("ls"), _call("ls"))
    await _collect(install(scripted), _request([MessageInput("user", "go")], [EXEC, WRITE, PATCH]))
    assert scripted.branch_names(0) == ["exec_command", "write_file", "final_answer"]
    assert "## apply_patch" not in scripted.prompts[0]
    await _collect(install(scripted), _request([MessageInput("user", "go")], [EXEC, PATCH]))
    assert scripted.branch_names(1) == ["exec_command", "apply_patch", "final_answer"]


async def test_an_answer_while_the_request_is_visibly_unfinished_must_become_a_call(
    install: Callable[..., LocalModel],
) -> None:
    items: list[InputItem] = [
        MessageInput("user", "Run `python3 t.py src` and copy t.py to /workspace/out/t.py."),
        FunctionCallInput("c1", "exec_command", '{"cmd": "python3 t.py src"}'),
        FunctionCallOutputInput("c1", "exit_code: 0\nsrc\n"),
    ]
    scripted = ScriptedModel(_answer("Done."), _call("cp t.py /workspace/out/t.py", "Copy it."))
    _, response = await _collect(install(scripted), _request(items))
    assert "Not done yet: no tool call has used /workspace/out/t.py yet." in scripted.prompts[1]
    assert scripted.branch_names(1) == ["exec_command"]  # no final_answer branch
    assert [c.arguments["cmd"] for c in response.tool_calls] == ["cp t.py /workspace/out/t.py"]


async def test_an_answer_after_a_check_that_found_nothing_missing_is_let_through(
    install: Callable[..., LocalModel],
) -> None:
    items: list[InputItem] = [
        MessageInput("user", "Run `python3 t.py src`."),
        FunctionCallInput("c1", "exec_command", '{"cmd": "python3 t.py src"}'),
        FunctionCallOutputInput("c1", "exit_code: 0\nsrc\n"),
    ]
    scripted = ScriptedModel(_answer("It printed src."), _answer("It printed src."))
    _, response = await _collect(install(scripted), _request(items))
    assert scripted.branch_names(1) == ["exec_command", "final_answer"]
    assert response.text == "It printed src."


async def test_a_repeat_while_the_request_is_visibly_unfinished_names_what_is_left(
    install: Callable[..., LocalModel],
) -> None:
    items: list[InputItem] = [
        MessageInput("user", "Make files, then run `python3 t.py src`."),
        MessageInput("assistant", "Make a file."),
        FunctionCallInput("c1", "exec_command", '{"cmd": "touch a"}'),
        FunctionCallOutputInput("c1", "exit_code: 0\n"),
    ]
    scripted = ScriptedModel(
        _call("touch a", "Make a file."), _call("touch a", "Make a file."), _call("python3 t.py src", "Run it.")
    )
    _, response = await _collect(install(scripted), _request(items))
    assert "Not done yet: `python3 t.py src` has not run successfully yet." in scripted.prompts[1]
    assert scripted.branch_names(2) == ["exec_command", "final_answer"]  # a third try is allowed
    assert [c.arguments["cmd"] for c in response.tool_calls] == ["python3 t.py src"]


async def test_shell_commands_saved_as_a_file_are_sent_back_once(install: Callable[..., LocalModel]) -> None:
    shell = ToolSpec("shell", "Run.", {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}, "workspace")
    copy = "cp /workspace/main.py /workspace/dist/main.py"
    scripted = ScriptedModel(
        _write("/workspace/dist/main.py", copy, "Copy it."),
        json.dumps({"thought": "Copy it.", "name": "shell", "arguments": {"command": copy}}),
    )
    _, response = await _collect(install(scripted), _request([MessageInput("user", "go")], [WRITE, shell]))
    assert "is shell commands" in scripted.prompts[1] and "Run commands with shell instead" in scripted.prompts[1]
    assert (response.tool_calls[0].name, response.tool_calls[0].arguments["command"]) == ("shell", copy)


SHELL = ToolSpec("shell", "Run.", {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}, "workspace")


async def test_an_empty_file_is_sent_back_once(install: Callable[..., LocalModel]) -> None:
    scripted = ScriptedModel(_write("dist/main.py", "", "Write it."), _write("dist/main.py", "", "Write it."))
    _, response = await _collect(install(scripted), _request([MessageInput("user", "go")], [WRITE, SHELL]))
    assert "its code block is empty, so dist/main.py would be an empty file" in scripted.prompts[1]
    assert response.tool_calls[0].arguments == {"path": "dist/main.py", "content": ""}  # the second goes through


def _written_then_run(path: str, code: str, run_output: str) -> list[InputItem]:
    """A turn that saved `code` at `path` and then ran `python3 main.py`."""
    return [
        MessageInput("user", "go"),
        FunctionCallInput("c1", "write_file", json.dumps({"path": path, "content": code})),
        FunctionCallOutputInput("c1", f"wrote {len(code)} bytes"),
        FunctionCallInput("c2", "shell", '{"command": "python3 main.py"}'),
        FunctionCallOutputInput("c2", run_output),
    ]


async def test_a_file_written_again_unchanged_is_sent_back(install: Callable[..., LocalModel]) -> None:
    code = "import os\nprint(os.listdir())\n"
    items = _written_then_run("/workspace/main.py", code, "exit_code: 1\nTypeError: x\n")
    fixed = code.replace("listdir()", "listdir('.')")
    scripted = ScriptedModel(_write("main.py", code, "Fix it."), _write("main.py", fixed, "Fix it."))
    _, response = await _collect(install(scripted), _request(items, [WRITE, SHELL]))
    assert "main.py already holds exactly this content" in scripted.prompts[1]
    assert "\nNot done yet: your last command failed (exit_code 1): TypeError: x." in scripted.prompts[1]
    assert response.tool_calls[0].arguments["content"] == fixed


async def test_a_file_written_again_unchanged_with_nothing_undone_goes_through(install: Callable[..., LocalModel]) -> None:
    code = "print(1)\n"
    items = _written_then_run("main.py", code, "exit_code: 0\n1\n")
    scripted = ScriptedModel(_write("main.py", code, "Write it again."))
    _, response = await _collect(install(scripted), _request(items, [WRITE, SHELL]))
    assert response.tool_calls[0].arguments["content"] == code and len(scripted.prompts) == 1


async def test_two_files_with_the_same_name_in_different_directories_are_both_written(install: Callable[..., LocalModel]) -> None:
    """Nothing assumes that a second file of the same name is meant to be a copy of the first."""
    items: list[InputItem] = [
        MessageInput("user", "Create the packages a and b."),
        FunctionCallInput("c1", "write_file", json.dumps({"path": "a/__init__.py", "content": "NAME = 'a'\n"})),
        FunctionCallOutputInput("c1", "wrote 11 bytes"),
    ]
    scripted = ScriptedModel(_write("b/__init__.py", "NAME = 'b'\n", "Now package b."))
    _, response = await _collect(install(scripted), _request(items, [WRITE, SHELL]))
    assert response.tool_calls[0].arguments == {"path": "b/__init__.py", "content": "NAME = 'b'\n"}
    assert len(scripted.prompts) == 1  # kept at once, not sent back
