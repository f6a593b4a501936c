"""`LedgerReserve`: the reserve stage's policy that runs every side effect at most once.

It covers every call of an operator tool declared `side_effect=True` (approved or not) and
claims the call's operation (`cairn.engine.ledger.keys`) for the job claim running it
(`cairn.store.ledger.claim_operation`), then acts on the answer:

- run: the entry is moved to `executing`, committed before the tool starts, and the call
  proceeds with `ctx.operation_key`; its `LedgerSettlement` settles the entry with the result;
- reuse / failed: the call finishes with the stored result or error, the tool does not run,
  and its item says so (`ledger.reused`);
- conflict: the same key was claimed with other arguments: refused, nothing runs;
- wait: a retry that is not due yet, or another live worker holding the entry: the call is
  deferred (its job comes back later, on any worker);
- probe: the worker that held the entry died while the tool ran. The tool's probe says
  whether it took effect: it did (succeeded with the probe's result), it did not (the entry
  is reopened and the call runs), or it cannot tell, or there is no probe: `uncertain`;
- uncertain: the call is held (`uncertain_effect`, with the reason) until a person resolves
  the entry; automatic retries stop for good.

After a crash the stage vouches for every call it covers: going through it again cannot
repeat an effect (design invariant 5).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import ClassVar

from cairn.blobs import BlobStore
from cairn.config import Settings
from cairn.durable.sealing import Sealer
from cairn.engine.ledger.keys import operation_of
from cairn.engine.ledger.results import load_output
from cairn.engine.ledger.settlement import LedgerSettlement, Reused
from cairn.engine.tools.base import Hold, ToolResult
from cairn.engine.tools.operator import OperatorTool, side_effect_tool
from cairn.engine.tools.pipeline import PROCEED, CallInFlight, Defer, Finish, Verdict
from cairn.engine.tools.reserve import ReservePolicy
from cairn.errors import CairnError, CairnMisuseError
from cairn.operator import ProbeAnswer, ProbeVerdict
from cairn.states import LedgerStatus
from cairn.store.db import Database
from cairn.store.ledger import ClaimKind, LedgerEntry, Operation, claim_operation, reopen_entry, settle_entry, start_execution

__all__ = ["UNCERTAIN_EFFECT", "LedgerReserve", "uncertain_effect"]

log = logging.getLogger(__name__)

# The required action of a call whose effect a person must resolve.
UNCERTAIN_EFFECT = "uncertain_effect"

_NO_PROBE = "the worker running it stopped while the tool ran, and the tool has no probe to tell whether it took effect"


def uncertain_effect(entry: LedgerEntry) -> Hold:
    """The hold of a call whose entry is `uncertain`: the session's `uncertain_effect` action."""
    action = {"operation_key": entry.operation_key, "tool": entry.tool_name, "reason": entry.reason}
    return Hold(call_id=entry.call_id, action_kind=UNCERTAIN_EFFECT, action=action)


def _message(exc: Exception) -> str:
    return exc.message if isinstance(exc, CairnError) else f"{type(exc).__name__}: {exc}"


class LedgerReserve(ReservePolicy):
    name: ClassVar[str] = "reserve"

    def __init__(self, db: Database, blobs: BlobStore, sealer: Sealer, settings: Settings) -> None:
        self._db = db
        self._blobs = blobs
        self._sealer = sealer
        self._settings = settings

    def covers(self, call: CallInFlight) -> bool:
        return side_effect_tool(call.tool) is not None

    async def vouches_for_rerun(self, call: CallInFlight) -> bool:
        return self.covers(call)

    async def run(self, call: CallInFlight) -> Verdict:
        tool = side_effect_tool(call.tool)
        if tool is None:
            return PROCEED
        token = call.lease_token
        if token is None:
            raise CairnMisuseError(f"call {call.call.call_id} of {tool.name} reached the ledger without its job's lease token")
        try:
            operation = operation_of(call, tool)
        except Exception as exc:  # the tool's key function is the operator's code
            log.exception("the key function of %s failed (call %s); the call does not run", tool.name, call.call.call_id)
            return Finish(ToolResult(error=f"the operation key of {tool.name} could not be derived ({_message(exc)}); "
                                           "the call did not run"))
        max_attempts = self._max_attempts(tool)
        async with self._db.write() as conn:
            claim = await claim_operation(conn, operation, token=token, now=self._db.now(), max_attempts=max_attempts)
        entry = claim.entry
        if claim.kind is ClaimKind.RUN:
            return await self._start(call, entry, token, max_attempts)
        if claim.kind is ClaimKind.REUSE:
            call.settlement = Reused(entry.operation_key)
            log.info("ledger %s: %s call %s reuses the stored result (the tool does not run)", entry.operation_key,
                     entry.tool_name, operation.call_id)
            # A stored result that does not open raises: the turn fails, nothing runs again.
            async with self._db.read() as conn:
                output = await load_output(conn, self._blobs, self._sealer, entry)
            return Finish(ToolResult(output=output))
        if claim.kind is ClaimKind.FAILED:
            call.settlement = Reused(entry.operation_key)
            return Finish(ToolResult(error=entry.error or "it failed"))
        if claim.kind is ClaimKind.CONFLICT:
            return self._refuse(operation, entry)
        if claim.kind is ClaimKind.WAIT:
            delay_s = claim.wait_s if claim.wait_s is not None else self._settings.lease_s / 3
            return Defer(delay_s, f"ledger entry {entry.operation_key} is {entry.status}; trying again in {delay_s:.1f} s")
        if claim.kind is ClaimKind.PROBE:
            return await self._probe(call, tool, entry, token, max_attempts)
        return uncertain_effect(entry)

    def _max_attempts(self, tool: OperatorTool) -> int:
        effect = tool.effect
        assert effect is not None
        return effect.max_attempts or self._settings.ledger_max_attempts

    async def _start(self, call: CallInFlight, entry: LedgerEntry, token: int, max_attempts: int) -> Verdict:
        """reserved → executing, committed before the tool runs; then on to execute."""
        async with self._db.write() as conn:
            running = await start_execution(conn, entry, token=token)
        call.context = dataclasses.replace(call.context, operation_key=running.operation_key)
        call.settlement = LedgerSettlement(
            self._db, self._blobs, self._sealer, self._settings, running, token=token, max_attempts=max_attempts
        )
        return PROCEED

    def _refuse(self, operation: Operation, entry: LedgerEntry) -> Finish:
        log.warning("ledger %s: %s call %s refused: the key was claimed with other arguments (call %s)",
                    entry.operation_key, operation.tool_name, operation.call_id, entry.call_id)
        return Finish(ToolResult(error=(
            f"refused: operation {entry.operation_key} of {operation.tool_name} was already claimed with other arguments "
            f"(arguments digest {entry.arguments_digest[:12]}…, this call's {operation.arguments_digest[:12]}…); "
            "the call did not run")))

    async def _probe(self, call: CallInFlight, tool: OperatorTool, entry: LedgerEntry, token: int, max_attempts: int) -> Verdict:
        """The worker that ran the tool died: ask the tool whether it took effect."""
        context = dataclasses.replace(call.context, operation_key=entry.operation_key)
        answer: ProbeAnswer | None
        try:
            answer = await tool.probe(call.arguments, context)
        except Exception as exc:  # the probe is the operator's code
            log.exception("the probe of %s failed (ledger %s)", tool.name, entry.operation_key)
            answer = ProbeAnswer.unsure(f"its probe failed ({_message(exc)})")
        if answer is not None and answer.verdict is ProbeVerdict.HAPPENED:
            try:
                output = tool.render_output(answer.result)
            except CairnError as exc:
                answer = ProbeAnswer.unsure(f"its probe said it happened, with a result that is not JSON ({exc.message})")
            else:
                log.info("ledger %s: the probe of %s says it happened", entry.operation_key, tool.name)
                call.context = context
                call.settlement = LedgerSettlement(
                    self._db, self._blobs, self._sealer, self._settings, entry, token=token, max_attempts=max_attempts, probed=True
                )
                return Finish(ToolResult(output=output))
        if answer is not None and answer.verdict is ProbeVerdict.DID_NOT_HAPPEN:
            log.info("ledger %s: the probe of %s says it did not happen; it runs again", entry.operation_key, tool.name)
            if entry.attempts >= max_attempts:
                call.settlement = LedgerSettlement(
                    self._db, self._blobs, self._sealer, self._settings, entry, token=token, max_attempts=max_attempts
                )
                return Finish(ToolResult(error=f"it did not take effect in {entry.attempts} attempts; not run again"))
            async with self._db.write() as conn:
                reopened = await reopen_entry(conn, entry, token=token)
            return await self._start(call, reopened, token, max_attempts)
        reason = _NO_PROBE if answer is None else f"the worker running it stopped while the tool ran; {answer.reason}"
        async with self._db.write() as conn:
            uncertain = await settle_entry(conn, entry, LedgerStatus.UNCERTAIN, token=token, reason=reason)
        log.warning("ledger %s: %s call %s is uncertain (%s); a person must resolve it (cairn ledger resolve)",
                    uncertain.operation_key, tool.name, uncertain.call_id, reason)
        return uncertain_effect(uncertain)
