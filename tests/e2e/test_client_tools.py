"""Client-side function tools (spec §6.4), the helpers' streams and result collection."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.lib.beta.agents._result import AgentTurnResultError

from cairn.testing.server import CairnServer
from tests.e2e.streams import EventTail, read_until

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _wait_until_idle(server: CairnServer, session_id: str) -> None:
    """Replay the session's log from the start until it shows the session idle after the tool's result."""
    tail = EventTail(server, session_id)
    tail.until(lambda event: event["type"] == "agent.session.idle" and any(
        e["type"] == "agent.session.turn.item.added" and e["item"]["type"] == "function_call_output" for e in tail.events
    ))


def _idle_session(client: openai.OpenAI, model: str = "scripted:client_tool", tools: list[Any] | None = None) -> str:
    session = client.beta.agents.sessions.create(
        agent={"model": model, "tools": tools if tools is not None else [WEATHER_TOOL]}, environment={"type": "openai_hosted"}
    )
    return session.id


def test_stream_runs_the_client_tool_and_returns_the_final_result(server: CairnServer, client: openai.OpenAI) -> None:
    session_id = _idle_session(client)
    calls: list[dict[str, Any]] = []

    def get_weather(arguments: Any) -> str:
        calls.append(arguments if isinstance(arguments, dict) else json.loads(arguments))
        return "sunny, 24°C"

    with client.beta.agents.sessions.stream(session_id, input="Weather in Paris?", tool_handlers={"get_weather": get_weather}) as stream:
        result = stream.get_final_result()
    assert calls == [{"city": "Paris"}]
    assert result.output_text == "It is sunny in Paris."
    assert result.turn.status == "completed" and result.session_id == session_id
    items = list(client.beta.agents.sessions.items.list(session_id, order="asc"))
    output = next(i for i in items if i.type == "function_call_output")
    assert output.output == "sunny, 24°C" and output.status == "completed"


def test_parallel_client_calls_wait_for_every_result(server: CairnServer, client: openai.OpenAI) -> None:
    session_id = _idle_session(client)
    with client.beta.agents.sessions.stream(session_id, input="one", tool_handlers={"get_weather": lambda a: "ok"}) as stream:
        stream.get_final_result()
    cities: list[str] = []

    def handler(arguments: Any) -> str:
        cities.append((arguments if isinstance(arguments, dict) else json.loads(arguments))["city"])
        return "cloudy"

    with client.beta.agents.sessions.stream(session_id, input="two", tool_handlers={"get_weather": handler}) as stream:
        result = stream.get_final_result()
    assert sorted(cities) == ["Oslo", "Rome"]
    assert result.output_text == "Oslo and Rome checked."


def test_requires_action_is_reported_and_resolved_over_rest(server: CairnServer, client: openai.OpenAI) -> None:
    sessions = client.beta.agents.sessions
    session_id = _idle_session(client)
    with sessions.events.stream(session_id) as live:
        sessions.events.create(session_id, events=[{"type": "agent.session.input.message", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]}]}])
        read_until(live, lambda event: event.type == "agent.session.requires_action", "the session to require an action")
    session = sessions.retrieve(session_id)
    assert session.status == "requires_action"
    action = session.required_actions[0]
    assert action.type == "function_call" and action.name == "get_weather"

    # The exact race error of spec §6.4 for a call that is not pending.
    response = httpx.post(
        f"{server.base_url}/agents/sessions/{session_id}/events",
        headers={"Authorization": f"Bearer {server.admin_key}"},
        json={"events": [{"type": "agent.session.input.tool_result", "turn_id": action.turn_id, "call_id": "call_nope", "success": True, "output": "x"}]},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request_error"
    assert response.json()["error"]["message"] == "Unknown pending tool call: call_nope"

    result = {"type": "agent.session.input.tool_result", "turn_id": action.turn_id, "call_id": action.call_id, "success": False, "error": "Tool handler failed."}
    key = {"Idempotency-Key": "result-1"}
    sessions.events.create(session_id, events=[result], extra_headers=key)
    sessions.events.create(session_id, events=[result], extra_headers=key)  # a retry changes nothing
    _wait_until_idle(server, session_id)
    items = list(sessions.items.list(session_id, order="asc"))
    outputs = [i for i in items if i.type == "function_call_output"]
    assert len(outputs) == 1 and outputs[0].status == "failed" and outputs[0].error == "Tool handler failed."
    assert sessions.retrieve(session_id).status == "idle"


def test_a_script_that_runs_out_fails_the_turn_not_the_server(server: CairnServer, client: openai.OpenAI) -> None:
    with client.beta.agents.sessions.create(
        agent={"model": "scripted:runs_out"}, environment={"type": "openai_hosted"}, input="go", stream=True
    ) as stream:
        events = list(stream)
    failed = next(e for e in events if e.type == "agent.session.turn.failed")
    assert failed.turn.error.code == "invalid_request" and "ran out" in failed.turn.error.message
    assert events[-1].type == "agent.session.idle"
    with client.beta.agents.sessions.stream(events[0].session.id, input="again") as stream:
        with pytest.raises(AgentTurnResultError) as failure:
            stream.get_final_result()
    assert failure.value.reason == "failed"
