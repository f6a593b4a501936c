"""The `validate` stage: the call names a tool of the turn, with arguments its schema accepts.

A call that fails is finished with a tool error the model sees (the tool never runs); the
turn goes on.
"""

from __future__ import annotations

from typing import ClassVar

from cairn.engine.tools.base import ToolArgumentError, ToolResult
from cairn.engine.tools.pipeline import PROCEED, CallInFlight, Finish, Stage, Verdict

__all__ = ["ValidateStage"]


class ValidateStage(Stage):
    name: ClassVar[str] = "validate"

    async def run(self, call: CallInFlight) -> Verdict:
        try:
            call.arguments = call.tool.parse(call.call.arguments)
        except ToolArgumentError as exc:
            return Finish(ToolResult(error=exc.message))
        return PROCEED
