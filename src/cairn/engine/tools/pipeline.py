"""The tool pipeline: the one way every tool call goes, whoever runs the tool.

    validate -> gate -> reserve -> execute -> record

The first four stages decide what becomes of a call; each is a small object with one job
behind the `Stage` interface, and answers `PROCEED` (on to the next stage), `Finish(result)`
(the call's result is known: straight to `record`, nothing later runs), a `Hold` (the call
stops where it is, recorded and not executed, and the turn waits for a person or the
client), or `Defer(delay_s)` (the call stays open and unrecorded, and the turn's job is
handed back to run again after the delay, on any worker: a retry's backoff). `record`
stores a result once, with its events, through the turn's fenced writer.

A stage that claims something for the call (the ledger's entry) leaves a `Settlement` on
it: once the call has a result, the settlement may turn it into a `Defer` (a failure worth
retrying), and otherwise settles its claim inside the very transaction that records the
result, so a worker that lost its lease can do neither.

- validate: the tool exists and the arguments fit its schema (else a tool error).
- gate: the deployment's `GatePolicy` may hold the call (an approval), refuse it (a result
  the model sees) or let it through; by default every call goes through.
- reserve: the deployment's `ReservePolicy` may claim the call's side effect before it runs
  (the idempotency ledger: it may also finish the call with a stored result, hold it when
  its outcome cannot be known, or defer it); by default nothing is claimed.
- execute: the tool runs (a client tool's run is the client's round trip: a hold).

A held call resumes by running the pipeline again: validation is a pure check of the
recorded arguments, so the call passes it unchanged and is decided again at the gate.
After a crash, an open call runs again only if a stage vouches that this cannot repeat an
effect (`Stage.vouches_for_rerun`): the gate still holds it, a reservation covers it, or
the tool only reads. Design invariant 2: nothing runs past a hold.

Every result a stage decides (the tool's, a probe's, a stored one, a refusal) leaves
`decide` with the session's known secret values replaced by a marker, before a settlement,
the record or a step run ahead sees it: what a call stores never holds a credential
(design invariant 6).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from cairn.engine.journal import Transaction
from cairn.engine.tools.base import Hold, Tool, ToolContext, ToolResult
from cairn.errors import CairnMisuseError
from cairn.models.base import ToolCall
from cairn.store.items import ItemRecord

__all__ = [
    "PROCEED",
    "CallInFlight",
    "Defer",
    "Finish",
    "Pipeline",
    "Proceed",
    "ResultRecorder",
    "Settlement",
    "Stage",
    "Verdict",
]


@dataclass(frozen=True, slots=True)
class Proceed:
    """On to the next stage."""


PROCEED = Proceed()


@dataclass(frozen=True, slots=True)
class Finish:
    """The call's result is known; the stages after this one, up to `record`, are skipped."""

    result: ToolResult


@dataclass(frozen=True, slots=True)
class Defer:
    """Not now: the call stays open and unrecorded; after the step's other calls the turn's
    job is handed back, claimable again in `delay_s`, and the call goes through the pipeline
    again then (on whichever worker claims it)."""

    delay_s: float
    reason: str


Verdict = Proceed | Finish | Hold | Defer


class Settlement(abc.ABC):
    """What a stage claimed for a call, settled once the call has a result."""

    @property
    @abc.abstractmethod
    def item_fields(self) -> Mapping[str, Any]:
        """Fields the call's item gets when its result is recorded (the ledger's `ledger`)."""

    async def defer(self, result: ToolResult) -> Defer | None:
        """Turn `result` into a deferral instead of recording it (a failure worth retrying)."""
        return None

    async def settle(self, tx: Transaction, result: ToolResult) -> None:
        """Settle the claim with `result`, in the transaction that records it."""


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
    # The lease token of the job claim running the call: what a stage's own writes are
    # fenced by (the ledger's). None where no job runs it (a test's single stage).
    lease_token: int | None = None
    # Left by a stage that claimed something for the call (`Settlement`).
    settlement: Settlement | None = None


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


def _redacted(result: ToolResult, context: ToolContext) -> ToolResult:
    """`result` with every known secret value in its output and error replaced."""
    redactor = context.known_values.redactor
    if redactor.is_empty:
        return result
    output = redactor.text(result.output) if result.output is not None else None
    error = redactor.text(result.error) if result.error is not None else None
    return dataclasses.replace(result, output=output, error=error)


class Pipeline:
    def __init__(self, stages: Sequence[Stage], record: ResultRecorder) -> None:
        self.stages = tuple(stages)
        self.record = record

    async def decide(self, call: CallInFlight) -> ToolResult | Hold | Defer:
        """Run the stages before `record`: the call's result, or the hold or deferral that
        stopped it."""
        for stage in self.stages:
            verdict = await stage.run(call)
            if isinstance(verdict, Finish):
                return _redacted(verdict.result, call.context)
            if isinstance(verdict, Hold | Defer):
                return verdict
        raise CairnMisuseError(f"no stage decided the call {call.call.call_id} ({call.tool.name})")

    async def run(self, call: CallInFlight) -> Hold | Defer | None:
        """Take a recorded call all the way: its result is stored (and its settlement settled),
        or the hold or deferral is returned."""
        outcome = await self.decide(call)
        if isinstance(outcome, Hold | Defer):
            return outcome
        if call.settlement is not None:
            deferred = await call.settlement.defer(outcome)
            if deferred is not None:
                return deferred
        await self.record.record(call, outcome)
        return None

    async def may_rerun(self, call: CallInFlight) -> bool:
        """Whether an open call left by a dead worker may go through the pipeline again."""
        for stage in self.stages:
            if await stage.vouches_for_rerun(call):
                return True
        return False
