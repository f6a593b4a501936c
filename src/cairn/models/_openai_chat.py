"""One model step over Chat Completions (`POST /chat/completions` with `stream: true`).

The API most OpenAI-compatible servers speak. Text arrives in `delta.content`; a tool call
arrives as `delta.tool_calls[]` fragments keyed by `index` (id and name first, then pieces of
the arguments), several calls interleaved when the model calls tools in parallel. The step ends
with a `finish_reason`, and usage follows in a last chunk with no choices because the request
asks for it (`stream_options.include_usage`). A server that does not send usage gives zeros.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

from openai import AsyncOpenAI, Omit, omit
from openai.types import CompletionUsage
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)
from openai.types.shared_params import ReasoningEffort

from cairn.models._openai_calls import CallAssembler
from cairn.models._openai_errors import incomplete_response_error, stream_ended_early_error
from cairn.models._openai_format import chat_response_format
from cairn.models.base import (
    FunctionCallInput,
    MessageInput,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    TextDelta,
    ToolSpec,
    Usage,
)

__all__ = ["stream_chat_step"]

# Finish reasons that mean the step is cut short, named as the Responses API names them.
_INCOMPLETE_FINISH_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


async def stream_chat_step(client: AsyncOpenAI, request: ModelRequest, model: str) -> AsyncIterator[ModelEvent]:
    """Run one step against `model`; `openai` exceptions pass through to the caller."""
    stream = await client.chat.completions.create(
        model=model,
        messages=_messages(request),
        tools=[_tool(spec) for spec in request.tools] if request.tools else omit,
        response_format=chat_response_format(request.text_format),
        reasoning_effort=_reasoning_effort(request.reasoning_effort),
        stream=True,
        stream_options={"include_usage": True},
    )
    text: list[str] = []
    calls = CallAssembler()
    finish_reason: str | None = None
    usage = Usage()
    async with stream:
        async for chunk in stream:
            if chunk.usage is not None:
                usage = _usage(chunk.usage)
            for choice in chunk.choices:
                delta = choice.delta
                # A refusal is what the model has to say this step, so it is shown as text.
                for piece in (delta.content, delta.refusal):
                    if piece:
                        text.append(piece)
                        yield TextDelta(piece)
                for fragment in delta.tool_calls or ():
                    function = fragment.function
                    calls.add_fragment(
                        fragment.index,
                        call_id=fragment.id,
                        name=function.name if function is not None else None,
                        arguments=function.arguments if function is not None else None,
                    )
                finish_reason = choice.finish_reason or finish_reason
    if finish_reason is None:
        raise stream_ended_early_error("a finish_reason")
    if finish_reason in _INCOMPLETE_FINISH_REASONS:
        raise incomplete_response_error(_INCOMPLETE_FINISH_REASONS[finish_reason])
    yield ModelResponse(text="".join(text) if text else None, tool_calls=calls.tool_calls(), usage=usage)


def _messages(request: ModelRequest) -> list[ChatCompletionMessageParam]:
    messages: list[ChatCompletionMessageParam] = []
    if request.instructions is not None:
        messages.append({"role": "system", "content": request.instructions})
    for item in request.input:
        if isinstance(item, MessageInput):
            messages.append(_message(item))
        elif isinstance(item, FunctionCallInput):
            _append_call(messages, item)
        else:
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    return messages


def _message(item: MessageInput) -> ChatCompletionMessageParam:
    if item.role == "user":
        return {"role": "user", "content": item.text}
    if item.role == "assistant":
        return {"role": "assistant", "content": item.text}
    return {"role": "system", "content": item.text}


def _append_call(messages: list[ChatCompletionMessageParam], item: FunctionCallInput) -> None:
    """Attach a call to the assistant message before it, as Chat Completions expects.

    Cairn keeps a step's text and each of its calls as separate items. Chat Completions wants
    them on one assistant message: a message with calls must be followed directly by the
    results of all of them, so parallel calls spread over several messages are rejected.
    """
    call: ChatCompletionMessageFunctionToolCallParam = {
        "id": item.call_id,
        "type": "function",
        "function": {"name": item.name, "arguments": item.arguments},
    }
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last["tool_calls"] = [*last.get("tool_calls", ()), call]
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _tool(spec: ToolSpec) -> ChatCompletionFunctionToolParam:
    return {
        "type": "function",
        "function": {"name": spec.name, "description": spec.description, "parameters": dict(spec.parameters)},
    }


def _reasoning_effort(effort: str | None) -> ReasoningEffort | Omit:
    # Passed through verbatim: compatible servers accept values OpenAI does not list, and the
    # endpoint rejects what it does not know with a 400 that becomes `invalid_request`.
    return cast(ReasoningEffort, effort) if effort is not None else omit


def _usage(usage: CompletionUsage) -> Usage:
    prompt_details = usage.prompt_tokens_details
    completion_details = usage.completion_tokens_details
    return Usage(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        cached_tokens=(prompt_details.cached_tokens or 0) if prompt_details is not None else 0,
        reasoning_tokens=(completion_details.reasoning_tokens or 0) if completion_details is not None else 0,
    )
