"""The main job on a real OpenAI-compatible endpoint: `cairn serve` configured with
OPENAI_BASE_URL talks to a fake endpoint over HTTP, in both wire formats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cairn.testing.server import CairnServer
from tests.e2e.conftest import make_server, remove_server
from tests.unit.models.openai_fake_server import FakeOpenAIServer, Reply, chat_sse, responses_sse, serve_in_thread

COMMAND = "mkdir -p /workspace/outputs && echo hi > /workspace/outputs/hi.txt && cat /workspace/outputs/hi.txt"


def _chat_chunk(delta: dict[str, Any] | None, finish_reason: str | None = None, **fields: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
    return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices, **fields}


def _chat_replies() -> list[Reply]:
    call = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "shell", "arguments": json.dumps({"command": COMMAND})}}]}
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    return [
        Reply(chat_sse(_chat_chunk(call), _chat_chunk({}, "tool_calls"), _chat_chunk(None, usage=usage))),
        Reply(chat_sse(_chat_chunk({"content": "Wrote "}), _chat_chunk({"content": "hi.txt."}), _chat_chunk({}, "stop"))),
    ]


def _responses_replies() -> list[Reply]:
    item = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell", "arguments": "", "status": "in_progress"}
    done = {**item, "arguments": json.dumps({"command": COMMAND}), "status": "completed"}
    response = {"id": "resp_1", "object": "response", "created_at": 1, "model": "m", "output": [], "status": "completed",
                "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
                          "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}
    text_item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}
    return [
        Reply(responses_sse(
            {"type": "response.output_item.added", "output_index": 0, "item": item},
            {"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": "fc_1", "delta": done["arguments"]},
            {"type": "response.output_item.done", "output_index": 0, "item": done},
            {"type": "response.completed", "response": response},
        )),
        Reply(responses_sse(
            {"type": "response.output_item.added", "output_index": 0, "item": text_item},
            {"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1", "content_index": 0, "delta": "Wrote hi.txt."},
            {"type": "response.completed", "response": response},
        )),
    ]


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_turn_runs_on_an_openai_compatible_endpoint(api: str, scripts_dir: Path) -> None:
    fake = FakeOpenAIServer()
    fake.script("fake-model", *(_chat_replies() if api == "chat" else _responses_replies()))
    with serve_in_thread(fake) as base_url:
        server: CairnServer = make_server(
            scripts_dir, env={"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "sk-test", "CAIRN_OPENAI_API": api}
        ).start()
        try:
            with server.client() as client:
                with client.beta.agents.sessions.create(
                    agent={"model": "fake-model", "instructions": "be brief"}, environment={"type": "openai_hosted"},
                    input="write hi.txt", stream=True,
                ) as stream:
                    events = list(stream)
                completed = next(e for e in events if e.type == "agent.session.turn.completed")
                assert completed.turn.status == "completed", [e.type for e in events]
                session_id = events[0].session.id
                items = list(client.beta.agents.sessions.items.list(session_id, order="asc"))
                command = next(i for i in items if i.type == "command_execution")
                assert command.output.strip() == "hi" and command.exit_code == 0
                assert items[-1].content[0].text == "Wrote hi.txt."
                assert [a.path for a in client.beta.agents.sessions.artifacts.list(session_id)] == ["/workspace/outputs/hi.txt"]
        finally:
            remove_server(server)
    requests = fake.requests("fake-model")
    assert len(requests) == 2
    assert requests[0].headers["authorization"] == "Bearer sk-test"
    tools = requests[0].body["tools"]
    names = {t["name"] if api == "responses" else t["function"]["name"] for t in tools}
    assert names == {"shell", "read_file", "write_file", "apply_patch"}
    assert "exit_code: 0" in json.dumps(requests[1].body), "the second request carries the command's result"
