"""One step of a turn: a model call, and its tool calls through the pipeline.

The model's text streams into an assistant message as it comes; its response is recorded
with the step (`TurnRecorder.record_step`), and each call then goes through the pipeline
in order. A step whose calls all only read the workspace runs them first: such a call
needs no record before it runs (running it again after a crash is harmless, and recovery
does just that), so the step, its calls and their results are stored in one transaction,
with the same events as if the calls had run after their record. A call the pipeline holds
stays recorded and open; the step returns the holds and the runner makes the turn wait.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio

from cairn.engine.events import command_output_delta, text_part_event
from cairn.engine.loop.begin import TurnStart
from cairn.engine.loop.recorder import TurnRecorder
from cairn.engine.runtime import Runtime
from cairn.engine.tools.base import Hold, Tool, ToolContext, ToolResult, recorded_call
from cairn.engine.tools.build import build_pipeline
from cairn.engine.tools.pipeline import CallInFlight, Pipeline
from cairn.engine.tools.toolbox import Toolbox, workspace_tools
from cairn.errors import CairnMisuseError, ModelError
from cairn.models.base import Model, ModelRequest, ModelResponse, TextDelta, ToolCall
from cairn.store.items import ItemRecord
from cairn.store.sessions import SessionRecord

__all__ = ["Step", "StepOutcome", "session_toolbox"]

log = logging.getLogger(__name__)

_MODEL_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What a step left: whether the model called tools, and the calls held before running."""

    has_calls: bool
    holds: list[Hold]


def session_toolbox(rt: Runtime, session: SessionRecord) -> Toolbox:
    """The tools a turn of `session` offers: built-in ones on its workspace, and its client
    tools; for a session pinned to a registered agent, that version's tools and its client tools."""

    def builtin() -> list[Tool]:
        environments = rt.environments
        return workspace_tools(rt.sandbox, environments.workspace_of, environments.files, command_timeout_s=rt.settings.command_timeout_s)

    return Toolbox.for_session(session, builtin, rt.agents)


class Step:
    """Runs the steps of one turn; holds what every step of the turn shares."""

    def __init__(self, recorder: TurnRecorder, model: Model, toolbox: Toolbox, pipeline: Pipeline) -> None:
        self.recorder = recorder
        self.model = model
        self.toolbox = toolbox
        self.pipeline = pipeline

    @classmethod
    def of_turn(cls, rt: Runtime, start: TurnStart, recorder: TurnRecorder) -> Step:
        """The steps of the turn `start` took up: the session's tools, the runtime's policies."""
        return cls(recorder, start.model, session_toolbox(rt, start.session), build_pipeline(rt.tool_policies, recorder))

    async def run(self) -> StepOutcome:
        """Ask the model for the next step, record it, and take its calls through the pipeline."""
        message, response = await self._ask_model()
        calls = response.tool_calls
        tools = [self.toolbox.get(call.name) for call in calls]
        if calls and all(tool.is_read_only for tool in tools):
            return StepOutcome(True, await self._run_ahead(message, response, tools))
        items = await self.recorder.record_step(message, response, tools, None)
        return StepOutcome(bool(calls), await self.run_calls(items))

    async def run_calls(self, items: Sequence[ItemRecord]) -> list[Hold]:
        """Take recorded calls through the pipeline, in order; returns those held."""
        holds = []
        for item in items:
            hold = await self.pipeline.run(self.call_in_flight(item))
            if hold is not None:
                holds.append(hold)
        return holds

    def call_in_flight(self, item: ItemRecord) -> CallInFlight:
        """A recorded call, ready for the pipeline; its output streams to its item."""
        call = recorded_call(item)
        stream = functools.partial(self._stream_output, item)
        return CallInFlight(call, self.toolbox.get(call.name), self._context(call, stream), item=item)

    async def _run_ahead(self, message: ItemRecord | None, response: ModelResponse, tools: Sequence[Tool]) -> list[Hold]:
        calls = response.tool_calls
        try:
            outcomes: list[ToolResult | Hold] = [
                await self.pipeline.decide(CallInFlight(call, tool, self._context(call, _no_stream))) for call, tool in zip(calls, tools)
            ]
        except Exception:
            # What the model asked for stays on record, as for a call run after its record:
            # the calls stay open and the turn's failure closes them.
            await self.recorder.record_step(message, response, tools, None)
            raise
        await self.recorder.record_step(message, response, tools, outcomes)
        return [outcome for outcome in outcomes if isinstance(outcome, Hold)]

    def _context(self, call: ToolCall, stream: Callable[[str], None]) -> ToolContext:
        return ToolContext(session=self.recorder.session, turn_id=self.recorder.turn.id, call_id=call.call_id, stream_output=stream)

    def _stream_output(self, item: ItemRecord, text: str) -> None:
        self.recorder.add_delta(command_output_delta(item, text))

    async def _ask_model(self) -> tuple[ItemRecord | None, ModelResponse]:
        """The model's response for the next step (retried on retryable failures), and the
        message its text streamed into, if any."""
        for attempt in range(1, _MODEL_ATTEMPTS + 1):
            message: ItemRecord | None = None
            try:
                turn = self.recorder.turn
                session = self.recorder.session
                request = ModelRequest(
                    session_id=session.id,
                    turn_id=turn.id,
                    turn_ordinal=turn.ordinal,
                    step=turn.step,
                    model=str(session.agent["model"]),
                    instructions=session.agent.get("instructions"),
                    input=self.recorder.model_input(),
                    tools=self.toolbox.specs,
                    text_format=(session.agent.get("text") or {}).get("format"),
                    reasoning_effort=(session.agent.get("reasoning") or {}).get("effort"),
                )
                async for event in self.model.stream(request):
                    if isinstance(event, TextDelta):
                        if message is None:
                            message = await self.recorder.open_message()
                        assert message.output_index is not None
                        self.recorder.add_delta(text_part_event("output_text.delta", message, message.output_index, delta=event.text))
                    else:
                        return message, event
                raise ModelError("the model stream ended without a response", code="server_error", retryable=True)
            except ModelError as exc:
                if message is not None:
                    await self.recorder.abandon_message(message)
                if not exc.retryable or attempt == _MODEL_ATTEMPTS:
                    raise
                log.warning("turn %s: model attempt %d failed (%s); retrying", self.recorder.turn.id, attempt, exc.message)
                await anyio.sleep(2 ** (attempt - 1))
        raise AssertionError("unreachable")



def _no_stream(text: str) -> None:
    """The output sink of a call run ahead of its record: only read-only tools run ahead,
    and none of them streams."""
    raise CairnMisuseError("a call run ahead of its record has no item to stream output to")
