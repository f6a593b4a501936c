"""The scripted model: script validation, step selection, deterministic call ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cairn.errors import InvalidRequestError, ModelError
from cairn.models.base import ModelRequest, ModelResponse, TextDelta
from cairn.models.scripted import ScriptedModel, load_script, script_from_mapping

pytestmark = pytest.mark.anyio


def _request(turn: int, step: int) -> ModelRequest:
    return ModelRequest(session_id="s", turn_id="turn_abc", turn_ordinal=turn, step=step, model="scripted:x",
                        instructions=None, input=[], tools=[])


async def _events(model: ScriptedModel, turn: int, step: int) -> list[object]:
    return [e async for e in model.stream(_request(turn, step))]


async def test_steps_play_in_order_with_stable_call_ids() -> None:
    model = script_from_mapping({"turns": [[{"say": "hello world", "call": "shell", "arguments": {"command": "ls"}}, {"say": "bye"}]]})
    first = await _events(model, 0, 0)
    assert "".join(e.text for e in first if isinstance(e, TextDelta)) == "hello world"
    response = first[-1]
    assert isinstance(response, ModelResponse) and response.tool_calls[0].call_id == "call_abc_0_0"
    assert first == await _events(model, 0, 0), "replaying a step gives the same answer"
    last = (await _events(model, 0, 1))[-1]
    assert isinstance(last, ModelResponse) and last.text == "bye" and not last.tool_calls


async def test_running_out_is_a_model_error_that_says_where() -> None:
    model = script_from_mapping({"turns": [[{"call": "shell", "arguments": {"command": "ls"}}]]})
    with pytest.raises(ModelError, match="ran out in turn 1"):
        await _events(model, 0, 1)
    with pytest.raises(ModelError, match="has 1 turn"):
        await _events(model, 1, 0)


@pytest.mark.parametrize(
    "script",
    [{"turns": [[{}]]}, {"turns": [[{"call": "a", "calls": []}]]}, {"turns": [[{"arguments": {}}]]}, {"turns": [[{"say": "x", "extra": 1}]]}, {"steps": []}],
)
def test_invalid_scripts_are_refused(script: dict[str, object]) -> None:
    with pytest.raises(InvalidRequestError):
        script_from_mapping(script)


def test_scripts_load_from_the_scripts_directory_only(tmp_path: Path) -> None:
    (tmp_path / "ok.json").write_text(json.dumps({"turns": [[{"say": "x"}]]}))
    (tmp_path / "bad.json").write_text("{")
    assert load_script(tmp_path, "ok").turns[0][0].say == "x"
    for name in ("bad", "missing", "../ok", ".hidden", ""):
        with pytest.raises(InvalidRequestError):
            load_script(tmp_path, name)
    with pytest.raises(InvalidRequestError, match="scripts directory"):
        load_script(None, "ok")
