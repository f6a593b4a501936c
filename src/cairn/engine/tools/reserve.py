"""The `reserve` stage: claim a call's side effect before it runs. The stage is the
deployment's `ReservePolicy`.

This is where an idempotency ledger claims the call's operation (`cairn.engine.ledger`): a
claimed call proceeds to execute, one whose effect already happened finishes with the
stored result, one whose outcome cannot be known holds the turn, and one to be retried
later is deferred; after a crash, the ledger vouches for the calls it covers. `covers` says
which calls those are, so that the gate can hand it a call that may already have run (an
approval that started). The default policy claims nothing: every call proceeds, and it
vouches for none.
"""

from __future__ import annotations

from typing import ClassVar

from cairn.engine.tools.pipeline import PROCEED, CallInFlight, Stage, Verdict

__all__ = ["ReserveNothing", "ReservePolicy"]


class ReservePolicy(Stage):
    name: ClassVar[str] = "reserve"

    def covers(self, call: CallInFlight) -> bool:
        """Whether this policy decides whether `call` may run, even after it may have run once."""
        return False


class ReserveNothing(ReservePolicy):
    async def run(self, call: CallInFlight) -> Verdict:
        return PROCEED
