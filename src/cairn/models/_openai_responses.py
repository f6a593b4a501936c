"""One model step over the Responses API (`POST /responses` with `stream: true`).

Text arrives as `response.output_text.delta` events and is passed on at once. A function call
opens with `response.output_item.added`, grows through `response.function_call_arguments.delta`
and is final in `response.output_item.done`; calls are keyed by `output_index`, so parallel
calls may interleave. `response.completed` ends the step and carries the usage. Any other
ending (`response.failed`, `response.incomplete`, an `error` event, or a stream that stops
without a terminal event) raises a `ModelError`, so the engine never sees half a step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

from openai import AsyncOpenAI, Omit, omit
from openai.types.responses import (
    FunctionToolParam,
    ResponseCompletedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInputItemParam,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseRefusalDeltaEvent,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from openai.types.shared_params import Reasoning, ReasoningEffort

from cairn.models._openai_calls import CallAssembler
from cairn.models._openai_errors import (
    incomplete_response_error,
    model_error_from_provider_code,
    stream_ended_early_error,
)
from cairn.models._openai_format import responses_text_config
from cairn.models.base import (
    FunctionCallInput,
    InputItem,
    MessageInput,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    TextDelta,
    ToolSpec,
    Usage,
)

__all__ = ["stream_responses_step"]


async def stream_responses_step(client: AsyncOpenAI, request: ModelRequest, model: str) -> AsyncIterator[ModelEvent]:
    """Run one step against `model`; `openai` exceptions pass through to the caller."""
    stream = await client.responses.create(
        model=model,
        instructions=request.instructions if request.instructions is not None else omit,
        input=[_input_item(item) for item in request.input],
        tools=[_tool(spec) for spec in request.tools] if request.tools else omit,
        text=responses_text_config(request.text_format),
        reasoning=_reasoning(request.reasoning_effort),
        # The engine sends the whole history every step, so nothing needs to live on the
        # provider; not storing keeps session content off third-party servers.
        store=False,
        stream=True,
    )
    text: list[str] = []
    calls = CallAssembler()
    async with stream:
        async for event in stream:
            if isinstance(event, ResponseTextDeltaEvent | ResponseRefusalDeltaEvent):
                # A refusal is what the model has to say this step, so it is shown as text.
                if event.delta:
                    text.append(event.delta)
                    yield TextDelta(event.delta)
            elif isinstance(event, ResponseOutputItemAddedEvent) and isinstance(event.item, ResponseFunctionToolCall):
                calls.add_fragment(
                    event.output_index,
                    call_id=event.item.call_id,
                    name=event.item.name,
                    arguments=event.item.arguments,
                )
            elif isinstance(event, ResponseFunctionCallArgumentsDeltaEvent):
                calls.add_fragment(event.output_index, arguments=event.delta)
            elif isinstance(event, ResponseOutputItemDoneEvent) and isinstance(event.item, ResponseFunctionToolCall):
                calls.complete(
                    event.output_index,
                    call_id=event.item.call_id,
                    name=event.item.name,
                    arguments=event.item.arguments,
                )
            elif isinstance(event, ResponseCompletedEvent):
                yield ModelResponse(
                    text="".join(text) if text else None,
                    tool_calls=calls.tool_calls(),
                    usage=_usage(event.response.usage),
                )
                return
            elif isinstance(event, ResponseFailedEvent):
                error = event.response.error
                if error is None:
                    raise model_error_from_provider_code(None, "the model response failed without details")
                raise model_error_from_provider_code(error.code, error.message, param=error.param)
            elif isinstance(event, ResponseIncompleteEvent):
                details = event.response.incomplete_details
                raise incomplete_response_error(details.reason if details is not None else None)
            elif isinstance(event, ResponseErrorEvent):
                raise model_error_from_provider_code(event.code, event.message, param=event.param)
    raise stream_ended_early_error("response.completed")


def _input_item(item: InputItem) -> ResponseInputItemParam:
    if isinstance(item, MessageInput):
        return {"type": "message", "role": item.role, "content": item.text}
    if isinstance(item, FunctionCallInput):
        return {"type": "function_call", "call_id": item.call_id, "name": item.name, "arguments": item.arguments}
    return {"type": "function_call_output", "call_id": item.call_id, "output": item.output}


def _tool(spec: ToolSpec) -> FunctionToolParam:
    # Strict mode demands every property be required and no extra properties be allowed;
    # tool schemas come from users and workspaces and need not follow those rules.
    return {
        "type": "function",
        "name": spec.name,
        "description": spec.description,
        "parameters": dict(spec.parameters),
        "strict": False,
    }


def _reasoning(effort: str | None) -> Reasoning | Omit:
    if effort is None:
        return omit
    # Passed through verbatim: compatible servers accept values OpenAI does not list, and the
    # endpoint rejects what it does not know with a 400 that becomes `invalid_request`.
    return {"effort": cast(ReasoningEffort, effort)}


def _usage(usage: ResponseUsage | None) -> Usage:
    if usage is None:
        return Usage()
    # The client does not validate responses, so token details that a compatible server leaves
    # out arrive as None even though the types say they are always there.
    input_details = usage.input_tokens_details
    output_details = usage.output_tokens_details
    return Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cached_tokens=input_details.cached_tokens if input_details is not None else 0,
        reasoning_tokens=output_details.reasoning_tokens if output_details is not None else 0,
    )
