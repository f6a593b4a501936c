"""The pipeline's order and its verdicts, with fake stages: a stage is tested alone in
test_stages.py."""

from __future__ import annotations

from typing import ClassVar

import pytest

from cairn.engine.tools import (
    PROCEED,
    CallInFlight,
    Finish,
    Hold,
    Pipeline,
    Stage,
    ToolPolicies,
    ToolResult,
    Verdict,
    build_pipeline,
)
from cairn.engine.tools.pipeline import ResultRecorder
from cairn.engine.tools.record import RecordStage
from cairn.engine.tools.toolbox import Toolbox
from cairn.errors import CairnMisuseError
from cairn.models.base import ToolCall
from tests.unit.engine.harness import EngineHarness

pytestmark = pytest.mark.anyio

_HOLD = Hold(call_id="call_1", action_kind="test", action={})


class _Fake(Stage):
    name: ClassVar[str] = "fake"

    def __init__(self, label: str, verdict: Verdict, passed: list[str], *, vouches: bool = False) -> None:
        self.label = label
        self.verdict = verdict
        self.passed = passed
        self.vouches = vouches

    async def run(self, call: CallInFlight) -> Verdict:
        self.passed.append(self.label)
        return self.verdict

    async def vouches_for_rerun(self, call: CallInFlight) -> bool:
        return self.vouches


class _Recorded(ResultRecorder):
    def __init__(self) -> None:
        self.results: list[ToolResult] = []

    async def record(self, call: CallInFlight, result: ToolResult) -> None:
        self.results.append(result)


@pytest.fixture
async def call(engine: EngineHarness) -> CallInFlight:
    engine.script([{"say": "unused"}])
    session_id = await engine.create_session(workspace=False)
    tool_call = ToolCall("call_1", "read_file", {"path": "a"})
    return CallInFlight(tool_call, Toolbox([]).get("read_file"), await engine.tool_context(session_id))


def _pipeline(passed: list[str], *verdicts: Verdict) -> tuple[Pipeline, _Recorded]:
    labels = ["validate", "gate", "reserve", "execute"]
    recorded = _Recorded()
    return Pipeline([_Fake(label, v, passed) for label, v in zip(labels, verdicts)], recorded), recorded


async def test_a_call_passes_every_stage_in_order_and_its_result_is_recorded(call: CallInFlight) -> None:
    passed: list[str] = []
    pipeline, recorded = _pipeline(passed, PROCEED, PROCEED, PROCEED, Finish(ToolResult(output="ran")))
    assert await pipeline.run(call) is None
    assert passed == ["validate", "gate", "reserve", "execute"]
    assert recorded.results == [ToolResult(output="ran")]


async def test_a_result_known_early_skips_the_later_stages_and_is_recorded(call: CallInFlight) -> None:
    passed: list[str] = []
    refused = ToolResult(error="refused by the gate")
    pipeline, recorded = _pipeline(passed, PROCEED, Finish(refused), PROCEED, Finish(ToolResult(output="ran")))
    assert await pipeline.run(call) is None
    assert passed == ["validate", "gate"] and recorded.results == [refused]


async def test_a_hold_stops_the_call_where_it_is_and_records_nothing(call: CallInFlight) -> None:
    passed: list[str] = []
    pipeline, recorded = _pipeline(passed, PROCEED, _HOLD, PROCEED, Finish(ToolResult(output="ran")))
    assert await pipeline.run(call) == _HOLD
    assert passed == ["validate", "gate"] and recorded.results == []


async def test_deciding_a_call_records_nothing(call: CallInFlight) -> None:
    passed: list[str] = []
    pipeline, recorded = _pipeline(passed, PROCEED, PROCEED, PROCEED, Finish(ToolResult(output="ran")))
    assert await pipeline.decide(call) == ToolResult(output="ran")
    assert recorded.results == []


async def test_a_pipeline_whose_stages_all_proceed_is_a_bug(call: CallInFlight) -> None:
    pipeline, _ = _pipeline([], PROCEED, PROCEED)
    with pytest.raises(CairnMisuseError, match="no stage decided"):
        await pipeline.run(call)


async def test_a_call_may_run_again_after_a_crash_when_any_stage_vouches_for_it(call: CallInFlight) -> None:
    recorded = _Recorded()
    nobody = Pipeline([_Fake("a", PROCEED, []), _Fake("b", PROCEED, [])], recorded)
    one = Pipeline([_Fake("a", PROCEED, []), _Fake("b", PROCEED, [], vouches=True)], recorded)
    assert not await nobody.may_rerun(call)
    assert await one.may_rerun(call)


async def test_the_built_pipeline_has_the_stages_in_their_order(engine: EngineHarness) -> None:
    engine.script([{"say": "unused"}])
    await engine.create_session()
    _, recorder = await engine.begin()
    pipeline = build_pipeline(ToolPolicies(), recorder)
    assert [stage.name for stage in pipeline.stages] == ["validate", "gate", "reserve", "execute"]
    assert isinstance(pipeline.record, RecordStage)
