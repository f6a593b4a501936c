"""The `execute` stage: run the tool.

A workspace tool runs here and finishes the call with its result; a client tool is handed
to the client, which holds the call until the client's result arrives. A read-only tool
vouches for itself after a crash: running it again changes nothing.
"""

from __future__ import annotations

from typing import ClassVar

from cairn.engine.tools.base import Hold
from cairn.engine.tools.pipeline import CallInFlight, Finish, Stage, Verdict

__all__ = ["ExecuteStage"]


class ExecuteStage(Stage):
    name: ClassVar[str] = "execute"

    async def run(self, call: CallInFlight) -> Verdict:
        outcome = await call.tool.execute(call.arguments, call.context)
        return outcome if isinstance(outcome, Hold) else Finish(outcome)

    async def vouches_for_rerun(self, call: CallInFlight) -> bool:
        return call.tool.is_read_only
