"""One step of a turn: a model call, and its tool calls through the pipeline.

The model's text streams into an assistant message as it comes; its response is recorded
with the step (`TurnRecorder.record_step`), and each call then goes through the pipeline
in order. A step whose calls all only read the workspace runs them first: such a call
needs no record before it runs (running it again after a crash is harmless, and recovery
does just that), so the step, its calls and their results are stored in one transaction,
with the same events as if the calls had run after their record. A call the pipeline holds
stays recorded and open; the step returns the holds and the runner makes the turn wait. A
call the pipeline defers (a retry's backoff) stays open too; the step's other calls still
run, and the runner then hands the turn's job back to come again after the delay.
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
from cairn.engine.tools.pipeline import CallInFlight, Defer, Pipeline
from cairn.engine.tools.toolbox import Toolbox, workspace_tools
from cairn.engine.vaults.injection import SessionSecrets, no_secrets
from cairn.errors import CairnMisuseError, ModelError
from cairn.models.base import Model, ModelRequest, ModelResponse, TextDelta, ToolCall
from cairn.operator import RunContext
from cairn.store.items import ItemRecord
from cairn.store.sessions import SessionRecord

__all__ = ["Step", "StepOutcome", "session_toolbox"]

log = logging.getLogger(__name__)

_MODEL_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What a step (or a run of recorded calls) left: whether there were calls, the calls held
    before running, and the soonest deferral of the calls deferred (None when none was)."""

    has_calls: bool
    holds: list[Hold]
    deferred: Defer | None = None


def session_toolbox(rt: Runtime, session: SessionRecord) -> Toolbox:
    """The tools a turn of `session` offers: built-in ones on its workspace, and its client
    tools; for a session pinned to a registered agent, that version's tools and its client tools."""

    def builtin() -> list[Tool]:
        environments = rt.environments
        return workspace_tools(rt.sandbox, environments.workspace_of, environments.files, command_timeout_s=rt.settings.command_timeout_s)

    return Toolbox.for_session(session, builtin, rt.agents)


class Step:
    """Runs the steps of one turn; holds what every step of the turn shares."""

    def __init__(
        self,
        recorder: TurnRecorder,
        model: Model,
        toolbox: Toolbox,
        pipeline: Pipeline,
        secrets: SessionSecrets | None = None,
        context: RunContext | None = None,
    ) -> None:
        self.recorder = recorder
        self.model = model
        self.toolbox = toolbox
        self.pipeline = pipeline
        self.secrets = secrets if secrets is not None else no_secrets()
        self.context = context if context is not None else RunContext()

    @classmethod
    def of_turn(cls, rt: Runtime, start: TurnStart, recorder: TurnRecorder) -> Step:
        """The steps of the turn `start` took up: the session's tools, the runtime's policies,
        the credentials this execution decrypted and the run's context."""
        toolbox = session_toolbox(rt, start.session)
        pipeline = build_pipeline(rt.tool_policies, recorder)
        return cls(recorder, start.model, toolbox, pipeline, start.secrets, start.context.values)

    async def run(self) -> StepOutcome:
        """Ask the model for the next step, record it, and take its calls through the pipeline."""
        message, response = await self._ask_model()
        calls = response.tool_calls
        tools = [self.toolbox.get(call.name) for call in calls]
        if calls and all(tool.is_read_only for tool in tools):
            return await self._run_ahead(message, response, tools)
        items = await self.recorder.record_step(message, response, tools, None)
        return await self.run_calls(items)

    async def run_calls(self, items: Sequence[ItemRecord]) -> StepOutcome:
        """Take recorded calls through the pipeline, in order; returns those held and deferred."""
        holds: list[Hold] = []
        deferred: Defer | None = None
        for item in items:
            stopped = await self.pipeline.run(self.call_in_flight(item))
            if isinstance(stopped, Hold):
                holds.append(stopped)
            elif stopped is not None and (deferred is None or stopped.delay_s < deferred.delay_s):
                deferred = stopped
        return StepOutcome(bool(items), holds, deferred)

    def call_in_flight(self, item: ItemRecord) -> CallInFlight:
        """A recorded call, ready for the pipeline; its output streams to its item."""
        call = recorded_call(item)
        stream = functools.partial(self._stream_output, item)
        tool = self.toolbox.get(call.name)
        return CallInFlight(call, tool, self._context(call, stream), item=item, lease_token=self.recorder.job.lease_token)

    async def _run_ahead(self, message: ItemRecord | None, response: ModelResponse, tools: Sequence[Tool]) -> StepOutcome:
        calls = response.tool_calls
        try:
            outcomes = [await self._decide_ahead(call, tool) for call, tool in zip(calls, tools)]
        except Exception:
            # What the model asked for stays on record, as for a call run after its record:
            # the calls stay open and the turn's failure closes them.
            await self.recorder.record_step(message, response, tools, None)
            raise
        await self.recorder.record_step(message, response, tools, outcomes)
        return StepOutcome(True, [outcome for outcome in outcomes if isinstance(outcome, Hold)])

    async def _decide_ahead(self, call: ToolCall, tool: Tool) -> ToolResult | Hold:
        """A read-only call's way through the stages before it is recorded. Nothing claims a
        read-only call (its stages leave no settlement and never defer it)."""
        in_flight = CallInFlight(call, tool, self._context(call, _no_stream), lease_token=self.recorder.job.lease_token)
        outcome = await self.pipeline.decide(in_flight)
        if isinstance(outcome, Defer) or in_flight.settlement is not None:
            raise CairnMisuseError(f"the read-only call {call.call_id} ({tool.name}) was claimed or deferred before its record")
        return outcome

    def _context(self, call: ToolCall, stream: Callable[[str], None]) -> ToolContext:
        secrets = self.secrets
        return ToolContext(
            session=self.recorder.session,
            turn_id=self.recorder.turn.id,
            call_id=call.call_id,
            stream_output=stream,
            credentials=secrets.tool_credentials,
            placeholders=secrets.env,
            wire_secrets=secrets.wire,
            known_values=secrets.known_values,
            run_context=self.context,
        )

    def _add_text_delta(self, message: ItemRecord, text: str) -> None:
        if text:
            assert message.output_index is not None
            self.recorder.add_delta(text_part_event("output_text.delta", message, message.output_index, delta=text))

    def _stream_output(self, item: ItemRecord, text: str) -> None:
        self.recorder.add_delta(command_output_delta(item, text))

    async def _ask_model(self) -> tuple[ItemRecord | None, ModelResponse]:
        """The model's response for the next step (retried on retryable failures), and the
        message its text streamed into, if any."""
        for attempt in range(1, _MODEL_ATTEMPTS + 1):
            message: ItemRecord | None = None
            # The text streams with the session's secret values taken out as it comes.
            shown = self.secrets.known_values.redactor.stream()
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
                        self._add_text_delta(message, shown.feed(event.text))
                    else:
                        if message is not None:
                            self._add_text_delta(message, shown.flush())
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
