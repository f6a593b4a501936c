"""The `reserve` stage: claim a call's side effect before it runs. The stage is the
deployment's `ReservePolicy`.

This is where an idempotency ledger claims the call's operation: a claimed call proceeds
to execute, one whose effect already happened finishes with the stored result, and one
whose outcome cannot be known holds the turn; after a crash, the ledger vouches for the
calls it covers. The default policy claims nothing: every call proceeds, and it vouches
for none.
"""

from __future__ import annotations

from typing import ClassVar

from cairn.engine.tools.pipeline import PROCEED, CallInFlight, Stage, Verdict

__all__ = ["ReserveNothing", "ReservePolicy"]


class ReservePolicy(Stage):
    name: ClassVar[str] = "reserve"


class ReserveNothing(ReservePolicy):
    async def run(self, call: CallInFlight) -> Verdict:
        return PROCEED
