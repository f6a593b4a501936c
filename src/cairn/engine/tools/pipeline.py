"""The tool pipeline: the one way every tool call goes, whoever runs the tool.

    validate -> gate -> reserve -> execute -> record

The first four stages decide what becomes of a call; each is a small object with one job
behind the `Stage` interface, and answers `PROCEED` (on to the next stage), `Finish(result)`
(the call's result is known: straight to `record`, nothing later runs), or a `Hold` (the
call stops where it is, recorded and not executed, and the turn waits). `record` stores a
result once, with its events, through the turn's fenced writer.

- validate: the tool exists and the arguments fit its schema (else a tool error).
- gate: the deployment's `GatePolicy` may hold the call (an approval), refuse it (a result
  the model sees) or let it through; by default every call goes through.
- reserve: the deployment's `ReservePolicy` may claim the call's side effect before it runs
  (a ledger); by default nothing is claimed.
- execute: the tool runs (a client tool's run is the client's round trip: a hold).

A held call resumes by running the pipeline again: validation is a pure check of the
recorded arguments, so the call passes it unchanged and is decided again at the gate.
After a crash, an open call runs again only if a stage vouches that this cannot repeat an
effect (`Stage.vouches_for_rerun`): the gate still holds it, a reservation covers it, or
the tool only reads. Design invariant 2: nothing runs past a hold.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from cairn.engine.tools.base import Hold, Tool, ToolContext, ToolResult
from cairn.errors import CairnMisuseError
from cairn.models.base import ToolCall
from cairn.store.items import ItemRecord

__all__ = ["PROCEED", "CallInFlight", "Finish", "Pipeline", "Proceed", "ResultRecorder", "Stage", "Verdict"]


@dataclass(frozen=True, slots=True)
class Proceed:
    """On to the next stage."""


PROCEED = Proceed()


@dataclass(frozen=True, slots=True)
class Finish:
    """The call's result is known; the stages after this one, up to `record`, are skipped."""

    result: ToolResult


Verdict = Proceed | Finish | Hold


@dataclass(slots=True)
class CallInFlight:
    """One call on its way through the pipeline."""

    call: ToolCall
    tool: Tool
    context: ToolContext
    # The item that records the call; None while a read-only step runs its calls ahead of
    # their record (`cairn.engine.loop.step`).
    item: ItemRecord | None = None
    # What validation made of `call.arguments`, for the stages after it.
    arguments: Any = None


class Stage(abc.ABC):
    """One stage before `record`. `run` may be called again for the same call (a held call
    resumes, a crash is recovered), so a stage's decision depends on what is durable, not on
    what it did before in this process."""

    name: ClassVar[str]

    @abc.abstractmethod
    async def run(self, call: CallInFlight) -> Verdict:
        """Decide the call's way on."""

    async def vouches_for_rerun(self, call: CallInFlight) -> bool:
        """After a crash: running this open call through the pipeline again cannot repeat an
        effect, because the call never got past this stage or this stage makes a second pass
        harmless. No stage vouches by default."""
        return False


class ResultRecorder(abc.ABC):
    """The `record` stage: stores a call's result once."""

    @abc.abstractmethod
    async def record(self, call: CallInFlight, result: ToolResult) -> None:
        """Store `result` as the end of the recorded `call.item`, with its events."""


class Pipeline:
    def __init__(self, stages: Sequence[Stage], record: ResultRecorder) -> None:
        self.stages = tuple(stages)
        self.record = record

    async def decide(self, call: CallInFlight) -> ToolResult | Hold:
        """Run the stages before `record`: the call's result, or the hold that stopped it."""
        for stage in self.stages:
            verdict = await stage.run(call)
            if isinstance(verdict, Finish):
                return verdict.result
            if isinstance(verdict, Hold):
                return verdict
        raise CairnMisuseError(f"no stage decided the call {call.call.call_id} ({call.tool.name})")

    async def run(self, call: CallInFlight) -> Hold | None:
        """Take a recorded call all the way: its result is stored, or the hold is returned."""
        outcome = await self.decide(call)
        if isinstance(outcome, Hold):
            return outcome
        await self.record.record(call, outcome)
        return None

    async def may_rerun(self, call: CallInFlight) -> bool:
        """Whether an open call left by a dead worker may go through the pipeline again."""
        for stage in self.stages:
            if await stage.vouches_for_rerun(call):
                return True
        return False
