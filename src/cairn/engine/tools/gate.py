"""The `gate` stage: whether a call may run now. The stage is the deployment's `GatePolicy`.

A policy lets the call through (`PROCEED`), refuses it (`Finish` with the error the model
sees; the tool never runs), or holds it (`Hold`): the call stays recorded and open, the turn
waits (`waiting`, the session `requires_action` with the hold's required action), and its
job ends. Whoever releases the hold resumes the turn (`cairn.engine.loop.waiting.
release_hold`); a worker then runs the call through the pipeline again and the policy
decides again. After a crash, a policy vouches for the calls it holds: they never ran.
The default policy lets every call through.
"""

from __future__ import annotations

from typing import ClassVar

from cairn.engine.tools.pipeline import PROCEED, CallInFlight, Stage, Verdict

__all__ = ["AllowEveryCall", "GatePolicy"]


class GatePolicy(Stage):
    name: ClassVar[str] = "gate"


class AllowEveryCall(GatePolicy):
    async def run(self, call: CallInFlight) -> Verdict:
        return PROCEED
