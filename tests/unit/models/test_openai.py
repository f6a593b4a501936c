"""The `openai:` provider driven through the real `openai` client against a local fake endpoint."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest
from openai_fake_server import FakeOpenAIServer, Reply, chat_sse, responses_sse, serve_in_thread

from cairn.errors import CairnMisuseError, ModelError
from cairn.models.base import (
    FunctionCallInput,
    FunctionCallOutputInput,
    InputItem,
    MessageInput,
    ModelRequest,
    ModelResponse,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
)
from cairn.models.openai import (
    RAW_ARGUMENTS_KEY,
    OpenAIApi,
    OpenAIModel,
    OpenAIModelConfig,
    create_openai_model,
)

pytestmark = pytest.mark.anyio

API_KEY = "sk-test-key"
READ_FILE = ToolSpec(
    name="read_file",
    description="Read a workspace file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    kind="workspace",
)


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"debug": True})


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeOpenAIServer, str]]:
    server = FakeOpenAIServer()
    with serve_in_thread(server) as base_url:
        yield server, base_url


@pytest.fixture
def server(fake: tuple[FakeOpenAIServer, str]) -> FakeOpenAIServer:
    return fake[0]


@pytest.fixture
def model_name() -> str:
    """A model name of this test's own, so scripted replies never cross tests."""
    return f"fake-{uuid.uuid4().hex[:12]}"


ModelFactory = Callable[..., OpenAIModel]


@pytest.fixture
async def make_model(fake: tuple[FakeOpenAIServer, str]) -> AsyncIterator[ModelFactory]:
    models: list[OpenAIModel] = []

    def make(
        api: OpenAIApi, *, base_url: str | None = None, timeout_s: float = 10.0, max_retries: int = 0
    ) -> OpenAIModel:
        config = OpenAIModelConfig(
            base_url=base_url or fake[1], api_key=API_KEY, api=api, timeout_s=timeout_s, max_retries=max_retries
        )
        model = create_openai_model(config)
        models.append(model)
        return model

    yield make
    for model in models:
        await model.aclose()


def make_request(
    model: str,
    *,
    input: Sequence[InputItem] = (MessageInput("user", "hi"),),
    tools: Sequence[ToolSpec] = (),
    instructions: str | None = "Be brief.",
    text_format: Mapping[str, Any] | None = None,
    reasoning_effort: str | None = None,
) -> ModelRequest:
    return ModelRequest(
        session_id="sess_1",
        turn_id="turn_1",
        turn_ordinal=1,
        step=0,
        model=f"openai:{model}",
        instructions=instructions,
        input=input,
        tools=tools,
        text_format=text_format,
        reasoning_effort=reasoning_effort,
    )


async def run_step(model: OpenAIModel, request: ModelRequest) -> tuple[list[str], ModelResponse]:
    """Consume one step and check the `Model.stream` contract on the way."""
    events = [event async for event in model.stream(request)]
    *deltas, last = events
    assert isinstance(last, ModelResponse)
    assert all(isinstance(delta, TextDelta) for delta in deltas)
    texts = [delta.text for delta in deltas if isinstance(delta, TextDelta)]
    assert "".join(texts) == (last.text or "")
    return texts, last


async def step_error(model: OpenAIModel, request: ModelRequest) -> ModelError:
    with pytest.raises(ModelError) as caught:
        await run_step(model, request)
    return caught.value


# --- Responses API event builders -------------------------------------------------------------


def response_object(status: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1700000000,
        "model": "fake",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "status": status,
        **fields,
    }


def text_delta(delta: str, output_index: int = 0) -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": output_index,
        "content_index": 0,
        "delta": delta,
        "logprobs": [],
    }


def call_item(event: str, index: int, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    status = "completed" if event == "response.output_item.done" else "in_progress"
    item = {"type": "function_call", "id": f"fc_{index}", "call_id": call_id, "name": name, "arguments": arguments}
    return {"type": event, "output_index": index, "item": {**item, "status": status}}


def arguments_delta(index: int, delta: str) -> dict[str, Any]:
    return {
        "type": "response.function_call_arguments.delta",
        "item_id": f"fc_{index}",
        "output_index": index,
        "delta": delta,
    }


def completed(usage: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "response.completed", "response": response_object("completed", usage=usage)}


def failed(code: str, message: str) -> dict[str, Any]:
    return {"type": "response.failed", "response": response_object("failed", error={"code": code, "message": message})}


def incomplete(reason: str) -> dict[str, Any]:
    details = {"reason": reason}
    return {"type": "response.incomplete", "response": response_object("incomplete", incomplete_details=details)}


def error_event(code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message, "param": None}


RESPONSES_USAGE = {
    "input_tokens": 120,
    "input_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 0},
    "output_tokens": 30,
    "output_tokens_details": {"reasoning_tokens": 12},
    "total_tokens": 150,
}


# --- Chat Completions chunk builders ----------------------------------------------------------


def chunk(delta: Mapping[str, Any] | None, finish_reason: str | None = None, **fields: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "fake",
        "choices": choices,
        **fields,
    }


def tool_fragment(
    index: int, *, call_id: str | None = None, name: str | None = None, arguments: str = ""
) -> dict[str, Any]:
    fragment: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        fragment.update(id=call_id, type="function")
        fragment["function"]["name"] = name
    return {"tool_calls": [fragment]}


EXPECTED_USAGE = Usage(input_tokens=120, output_tokens=30, cached_tokens=100, reasoning_tokens=12)
CHAT_USAGE = {
    "prompt_tokens": 120,
    "completion_tokens": 30,
    "total_tokens": 150,
    "prompt_tokens_details": {"cached_tokens": 100},
    "completion_tokens_details": {"reasoning_tokens": 12},
}


def chat_call(call_id: str, arguments: str) -> dict[str, Any]:
    """A `read_file` call as Chat Completions expects it in an assistant message."""
    return {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": arguments}}


def text_reply(api: OpenAIApi, *pieces: str) -> Reply:
    if api == "responses":
        return Reply(responses_sse(*(text_delta(piece) for piece in pieces), completed(RESPONSES_USAGE)))
    chunks = [chunk({"content": piece}) for piece in pieces]
    return Reply(chat_sse(*chunks, chunk({}, "stop"), chunk(None, usage=CHAT_USAGE)))


def call_reply(api: OpenAIApi, arguments: str) -> Reply:
    """A step with one `read_file` call whose argument text is streamed in one fragment."""
    if api == "responses":
        added = call_item("response.output_item.added", 0, "call_0", "read_file", "")
        return Reply(responses_sse(added, arguments_delta(0, arguments), completed()))
    fragment = tool_fragment(0, call_id="call_0", name="read_file", arguments=arguments)
    return Reply(chat_sse(chunk(fragment), chunk({}, "tool_calls")))


# --- Responses API ----------------------------------------------------------------------------


async def test_responses_streams_text_deltas_and_usage(
    server: FakeOpenAIServer, make_model: ModelFactory, model_name: str
) -> None:
    server.script(model_name, text_reply("responses", "Hel", "lo"))

    texts, response = await run_step(make_model("responses"), make_request(model_name))

    assert texts == ["Hel", "lo"]
    assert response == ModelResponse(text="Hello", tool_calls=(), usage=EXPECTED_USAGE)
    (sent,) = server.requests(model_name)
    assert sent.path == "/v1/responses"
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.body["model"] == model_name  # the "openai:" prefix is stripped
    assert sent.body["instructions"] == "Be brief."
    assert sent.body["input"] == [{"type": "message", "role": "user", "content": "hi"}]
    assert sent.body["stream"] is True
    assert sent.body["store"] is False
    assert "tools" not in sent.body and "text" not in sent.body and "reasoning" not in sent.body


async def test_responses_assembles_parallel_calls_from_interleaved_fragments(
    server: FakeOpenAIServer, make_model: ModelFactory, model_name: str
) -> None:
    server.script(
        model_name,
        Reply(
            responses_sse(
                text_delta("Reading both."),
                call_item("response.output_item.added", 1, "call_a", "read_file", ""),
                call_item("response.output_item.added", 2, "call_b", "read_file", ""),
                arguments_delta(1, '{"pa'),
                arguments_delta(2, '{"path": "b.txt"}'),
                arguments_delta(1, 'th": "a.txt"}'),
                call_item("response.output_item.done", 2, "call_b", "read_file", '{"path": "b.txt"}'),
                call_item("response.output_item.done", 1, "call_a", "read_file", '{"path": "a.txt"}'),
                completed(RESPONSES_USAGE),
            )
        ),
    )
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    request = make_request(
        model_name,
        tools=[READ_FILE],
        input=[
            MessageInput("user", "read a and b"),
            FunctionCallInput("call_0", "read_file", '{"path": "c.txt"}'),
            FunctionCallOutputInput("call_0", "gamma"),
        ],
        text_format={"type": "json_schema", "schema": schema},
        reasoning_effort="low",
    )

    _, response = await run_step(make_model("responses"), request)

    assert response.text == "Reading both."
    assert response.tool_calls == (
        ToolCall("call_a", "read_file", {"path": "a.txt"}),
        ToolCall("call_b", "read_file", {"path": "b.txt"}),
    )
    (sent,) = server.requests(model_name)
    assert sent.body["tools"] == [
        {
            "type": "function",
            "name": "read_file",
            "description": "Read a workspace file.",
            "parameters": dict(READ_FILE.parameters),
            "strict": False,
        }
    ]
    assert sent.body["input"][1:] == [
        {"type": "function_call", "call_id": "call_0", "name": "read_file", "arguments": '{"path": "c.txt"}'},
        {"type": "function_call_output", "call_id": "call_0", "output": "gamma"},
    ]
    assert sent.body["text"] == {"format": {"type": "json_schema", "name": "output", "schema": schema, "strict": True}}
    assert sent.body["reasoning"] == {"effort": "low"}


@pytest.mark.parametrize(
    ("event", "code", "retryable"),
    [
        (failed("rate_limit_exceeded", "slow down"), "rate_limit_exceeded", True),
        (failed("invalid_prompt", "no"), "invalid_request", False),
        (incomplete("max_output_tokens"), "max_output_tokens", False),
        (error_event("server_error", "boom"), "server_error", True),
        (error_event("context_length_exceeded", "too long"), "context_length_exceeded", False),
    ],
    ids=["failed-rate-limit", "failed-invalid-prompt", "incomplete", "error-event", "error-event-context"],
)
async def test_responses_unsuccessful_endings_raise_model_errors(
    server: FakeOpenAIServer,
    make_model: ModelFactory,
    model_name: str,
    event: dict[str, Any],
    code: str,
    retryable: bool,
) -> None:
    server.script(model_name, Reply(responses_sse(text_delta("partial"), event)))

    error = await step_error(make_model("responses"), make_request(model_name))

    assert (error.code, error.retryable) == (code, retryable)


async def test_responses_stream_without_completed_event_is_retryable(
    server: FakeOpenAIServer, make_model: ModelFactory, model_name: str
) -> None:
    server.script(model_name, Reply(responses_sse(text_delta("cut"))))

    error = await step_error(make_model("responses"), make_request(model_name))

    assert (error.code, error.retryable) == ("server_error", True)
    assert "response.completed" in error.message


# --- Chat Completions -------------------------------------------------------------------------


async def test_chat_streams_text_deltas_and_usage(
    server: FakeOpenAIServer, make_model: ModelFactory, model_name: str
) -> None:
    server.script(model_name, text_reply("chat", "Hel", "lo"))

    texts, response = await run_step(make_model("chat"), make_request(model_name))

    assert texts == ["Hel", "lo"]
    assert response == ModelResponse(text="Hello", tool_calls=(), usage=EXPECTED_USAGE)
    (sent,) = server.requests(model_name)
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.body["model"] == model_name
    assert sent.body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert sent.body["stream"] is True
    assert sent.body["stream_options"] == {"include_usage": True}
    assert "tools" not in sent.body and "response_format" not in sent.body


async def test_chat_assembles_parallel_calls_from_interleaved_fragments(
    server: FakeOpenAIServer, make_model: ModelFactory, model_name: str
) -> None:
    server.script(
        model_name,
        Reply(
            chat_sse(
                chunk({"role": "assistant", "content": None}),
                chunk(tool_fragment(0, call_id="call_a", name="read_file")),
                chunk(tool_fragment(1, call_id="call_b", name="read_file", arguments='{"path": ')),
                chunk(tool_fragment(0, arguments='{"path": "a.txt"}')),
                # Some compatible servers repeat the id and name on every fragment.
                chunk(tool_fragment(1, call_id="call_b", name="read_file", arguments='"b.txt"}')),
                chunk({}, "tool_calls"),
                chunk(None, usage=CHAT_USAGE),
            )
        ),
    )
    request = make_request(
        model_name,
        tools=[READ_FILE],
        input=[
            MessageInput("user", "read c and d"),
            MessageInput("assistant", "Reading."),
            FunctionCallInput("call_c", "read_file", '{"path": "c.txt"}'),
            FunctionCallInput("call_d", "read_file", '{"path": "d.txt"}'),
            FunctionCallOutputInput("call_c", "gamma"),
            FunctionCallOutputInput("call_d", "delta"),
        ],
        text_format={"type": "json_object"},
        reasoning_effort="high",
    )

    _, response = await run_step(make_model("chat"), request)

    assert response.text is None
    assert response.tool_calls == (
        ToolCall("call_a", "read_file", {"path": "a.txt"}),
        ToolCall("call_b", "read_file", {"path": "b.txt"}),
    )
    (sent,) = server.requests(model_name)
    assert sent.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a workspace file.",
                "parameters": dict(READ_FILE.parameters),
            },
        }
    ]
    # A step's text and its parallel calls travel on one assistant message.
    assert sent.body["messages"][2:] == [
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [chat_call("call_c", '{"path": "c.txt"}'), chat_call("call_d", '{"path": "d.txt"}')],
        },
        {"role": "tool", "tool_call_id": "call_c", "content": "gamma"},
        {"role": "tool", "tool_call_id": "call_d", "content": "delta"},
    ]
    assert sent.body["response_format"] == {"type": "json_object"}
    assert sent.body["reasoning_effort"] == "high"


async def test_chat_sends_json_schema_nested_and_calls_without_text_on_their_own_message(
    server: FakeOpenAIServer, make_model: ModelFactory, model_name: str
) -> None:
    server.script(model_name, text_reply("chat", "{}"))
    schema = {"type": "object", "properties": {}, "additionalProperties": False}
    request = make_request(
        model_name,
        instructions=None,
        input=[
            MessageInput("user", "go"),
            FunctionCallInput("call_c", "read_file", "{}"),
            FunctionCallOutputInput("call_c", "x"),
        ],
        text_format={"type": "json_schema", "name": "Answer", "schema": schema, "strict": False},
    )

    await run_step(make_model("chat"), request)

    (sent,) = server.requests(model_name)
    assert sent.body["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [chat_call("call_c", "{}")],
    }
    assert sent.body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Answer", "schema": schema, "strict": False},
    }


@pytest.mark.parametrize(
    ("finish_reason", "code"), [("length", "max_output_tokens"), ("content_filter", "invalid_request")]
)
async def test_chat_cut_short_steps_raise_non_retryable_errors(
    server: FakeOpenAIServer, make_model: ModelFactory, model_name: str, finish_reason: str, code: str
) -> None:
    server.script(model_name, Reply(chat_sse(chunk({"content": "par"}), chunk({}, finish_reason))))

    error = await step_error(make_model("chat"), make_request(model_name))

    assert (error.code, error.retryable) == (code, False)


@pytest.mark.parametrize(
    ("error_object", "code", "retryable"),
    [
        ({"message": "This model's maximum context length is 4096 tokens"}, "context_length_exceeded", False),
        ({"message": "rate limited", "code": "rate_limit_exceeded"}, "rate_limit_exceeded", True),
        # vLLM sends the HTTP status as the code.
        ({"object": "error", "message": "bad grammar", "type": "BadRequestError", "code": 400}, "invalid_request", False),
        ({"message": "worker died"}, "server_error", True),
    ],
    ids=["context-message", "provider-code", "numeric-code", "unknown"],
)
async def test_chat_error_object_inside_the_stream_is_translated(
    server: FakeOpenAIServer,
    make_model: ModelFactory,
    model_name: str,
    error_object: dict[str, Any],
    code: str,
    retryable: bool,
) -> None:
    server.script(model_name, Reply(chat_sse(chunk({"content": "par"}), {"error": error_object})))

    error = await step_error(make_model("chat"), make_request(model_name))

    assert (error.code, error.retryable) == (code, retryable)


async def test_chat_stream_without_finish_reason_is_retryable(
    server: FakeOpenAIServer, make_model: ModelFactory, model_name: str
) -> None:
    server.script(model_name, Reply(chat_sse(chunk({"content": "cut"}))))

    error = await step_error(make_model("chat"), make_request(model_name))

    assert (error.code, error.retryable) == ("server_error", True)


# --- Behaviour shared by both APIs ------------------------------------------------------------


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_text_is_passed_on_before_the_step_ends(
    server: FakeOpenAIServer, make_model: ModelFactory, model_name: str, api: OpenAIApi
) -> None:
    # The server keeps the stream open after the first delta, so only a provider that passes
    # text on as it arrives can yield it; closing the step early must release the connection.
    first = text_reply(api, "Thinking").frames[0]
    server.script(model_name, Reply((first,), is_hanging=True))
    steps = make_model(api).stream(make_request(model_name))

    assert await anext(steps) == TextDelta("Thinking")
    assert isinstance(steps, AsyncGenerator)
    await steps.aclose()


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_a_refusal_is_streamed_as_text(
    server: FakeOpenAIServer, make_model: ModelFactory, model_name: str, api: OpenAIApi
) -> None:
    refusal = "I can't help with that."
    if api == "responses":
        event = {**text_delta(refusal), "type": "response.refusal.delta"}
        del event["logprobs"]
        server.script(model_name, Reply(responses_sse(event, completed())))
    else:
        server.script(model_name, Reply(chat_sse(chunk({"refusal": refusal}), chunk({}, "stop"))))

    texts, response = await run_step(make_model(api), make_request(model_name))

    assert texts == [refusal]
    assert response.text == refusal


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize(
    ("arguments", "decoded"),
    [
        ("{not json", {RAW_ARGUMENTS_KEY: "{not json"}),
        ("[1, 2]", {RAW_ARGUMENTS_KEY: "[1, 2]"}),
        ("", {}),
        ('{"path": "a.txt"}', {"path": "a.txt"}),
    ],
    ids=["malformed", "not-an-object", "blank", "object"],
)
async def test_arguments_that_are_not_a_json_object_reach_the_engine_verbatim(
    server: FakeOpenAIServer,
    make_model: ModelFactory,
    model_name: str,
    api: OpenAIApi,
    arguments: str,
    decoded: Mapping[str, Any],
) -> None:
    server.script(model_name, call_reply(api, arguments))

    _, response = await run_step(make_model(api), make_request(model_name, tools=[READ_FILE]))

    assert response.tool_calls == (ToolCall("call_0", "read_file", decoded),)


def error_reply(status: int, message: str, code: str | None = None, error_type: str = "invalid_request_error") -> Reply:
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return Reply(status=status, error_body=body)


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize(
    ("reply", "code", "retryable"),
    [
        (error_reply(401, "Incorrect API key provided", "invalid_api_key"), "authentication_error", False),
        (error_reply(403, "You may not use this model"), "authentication_error", False),
        (error_reply(404, "The model does not exist", "model_not_found"), "resource_not_found", False),
        (error_reply(429, "Rate limit reached", "rate_limit_exceeded"), "rate_limit_exceeded", True),
        (error_reply(429, "You exceeded your current quota", "insufficient_quota"), "usage_limit_exceeded", False),
        (error_reply(400, "Too many tokens", "context_length_exceeded"), "context_length_exceeded", False),
        (error_reply(400, "This model's maximum context length is 4096 tokens."), "context_length_exceeded", False),
        (error_reply(400, "Invalid value for 'tools'"), "invalid_request", False),
        (error_reply(500, "The server had an error", error_type="server_error"), "server_error", True),
        (error_reply(503, "The engine is currently overloaded", error_type="server_error"), "server_overloaded", True),
    ],
    ids=["401", "403", "404", "429", "429-quota", "400-context-code", "400-context-message", "400", "500", "503"],
)
async def test_http_errors_map_to_turn_error_codes(
    server: FakeOpenAIServer,
    make_model: ModelFactory,
    model_name: str,
    api: OpenAIApi,
    reply: Reply,
    code: str,
    retryable: bool,
) -> None:
    server.script(model_name, reply)

    error = await step_error(make_model(api), make_request(model_name))

    assert (error.code, error.retryable) == (code, retryable)
    assert error.context["status"] == reply.status
    assert isinstance(error.__cause__, Exception)  # translated with `raise ... from`
    assert API_KEY not in str(error) and API_KEY not in json.dumps(dict(error.context))


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_client_retries_are_spent_before_an_error_is_raised(
    server: FakeOpenAIServer, make_model: ModelFactory, model_name: str, api: OpenAIApi
) -> None:
    flaky = Reply(status=500, error_body={"error": {"message": "flaky"}}, headers={"retry-after-ms": "1"})
    server.script(model_name, flaky, text_reply(api, "ok"))

    _, response = await run_step(make_model(api, max_retries=1), make_request(model_name))

    assert response.text == "ok"
    assert len(server.requests(model_name)) == 2


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_unreachable_endpoint_is_a_retryable_connection_failure(make_model: ModelFactory, api: OpenAIApi) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    model = make_model(api, base_url=f"http://127.0.0.1:{closed_port}/v1")

    error = await step_error(model, make_request("anything"))

    assert (error.code, error.retryable) == ("connection_failed", True)


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_a_stalled_stream_times_out_as_retryable(
    server: FakeOpenAIServer, make_model: ModelFactory, model_name: str, api: OpenAIApi
) -> None:
    first = text_reply(api, "slow").frames[0]
    server.script(model_name, Reply((first,), is_hanging=True))
    model = make_model(api, timeout_s=0.2)

    error = await step_error(model, make_request(model_name))

    assert (error.code, error.retryable) == ("request_timeout", True)


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_an_unsupported_text_format_fails_before_any_request(
    server: FakeOpenAIServer, make_model: ModelFactory, model_name: str, api: OpenAIApi
) -> None:
    error = await step_error(make_model(api), make_request(model_name, text_format={"type": "yaml"}))

    assert (error.code, error.param, error.retryable) == ("invalid_request", "agent.text.format", False)
    assert server.requests(model_name) == []


def test_config_repr_hides_the_api_key() -> None:
    config = OpenAIModelConfig(base_url=None, api_key=API_KEY)

    assert API_KEY not in repr(config)


@pytest.mark.parametrize(
    "fields", [{"api": "completions"}, {"timeout_s": 0}, {"max_retries": -1}], ids=["api", "timeout", "retries"]
)
def test_config_rejects_impossible_settings(fields: dict[str, Any]) -> None:
    with pytest.raises(CairnMisuseError):
        OpenAIModelConfig(base_url=None, api_key=API_KEY, **fields)
