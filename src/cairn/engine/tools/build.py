"""The pipeline every turn's calls go through, with the deployment's policies in it."""

from __future__ import annotations

from dataclasses import dataclass, field

from cairn.engine.tools.execute import ExecuteStage
from cairn.engine.tools.gate import AllowEveryCall, GatePolicy
from cairn.engine.tools.pipeline import Pipeline
from cairn.engine.tools.record import RecordStage, TurnWriter
from cairn.engine.tools.reserve import ReserveNothing, ReservePolicy
from cairn.engine.tools.validate import ValidateStage

__all__ = ["ToolPolicies", "build_pipeline"]


@dataclass(frozen=True, slots=True)
class ToolPolicies:
    """The pipeline's policy stages; by default every call runs, unclaimed."""

    gate: GatePolicy = field(default_factory=AllowEveryCall)
    reserve: ReservePolicy = field(default_factory=ReserveNothing)


def build_pipeline(policies: ToolPolicies, writer: TurnWriter) -> Pipeline:
    """validate -> gate -> reserve -> execute -> record, recording through `writer`."""
    stages = [ValidateStage(), policies.gate, policies.reserve, ExecuteStage()]
    return Pipeline(stages, RecordStage(writer))
