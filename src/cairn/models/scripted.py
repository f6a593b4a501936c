"""A deterministic model that plays a JSON script: for tests, demos and users' own tests.

`<scripts-dir>/NAME.json` holds `{"turns": [[STEP, ...], ...]}`. The session's n-th turn
(its ordinal, counted from 0) plays list n; the k-th model step of that turn plays STEP k.
Each STEP is `{"call": TOOL, "arguments": {...}}`, `{"calls": [{"call", "arguments"}, ...]}`
or `{"say": TEXT}`; `"say"` may accompany calls. Because the engine stores the step
counter durably, a restarted server continues where it was. A script that runs out is a
turn failure with a clear message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cairn.errors import InvalidRequestError, ModelError
from cairn.models.base import Model, ModelEvent, ModelRequest, ModelResponse, TextDelta, ToolCall

__all__ = ["Script", "ScriptedModel", "load_script", "script_from_mapping"]


class _Call(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    call: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class _Step(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    say: str | None = None
    call: str | None = None
    arguments: dict[str, Any] | None = None
    calls: list[_Call] | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> _Step:
        if self.call is None and self.arguments is not None:
            raise ValueError("`arguments` needs `call`")
        if self.call is not None and self.calls is not None:
            raise ValueError("use either `call` or `calls`, not both")
        if self.say is None and self.call is None and not self.calls:
            raise ValueError("a step needs `say`, `call` or `calls`")
        return self

    def tool_calls(self) -> list[_Call]:
        if self.call is not None:
            return [_Call(call=self.call, arguments=self.arguments or {})]
        return list(self.calls or [])


class Script(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    turns: list[list[_Step]]


def load_script(scripts_dir: Path | None, name: str) -> Script:
    """Load and validate `<scripts_dir>/<name>.json`; errors name the file and the problem."""
    if scripts_dir is None:
        raise InvalidRequestError("scripted models need a scripts directory (cairn serve --scripts-dir)", param="agent.model")
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise InvalidRequestError(f"bad script name {name!r}", param="agent.model")
    path = scripts_dir / f"{name}.json"
    try:
        return Script.model_validate_json(path.read_bytes())
    except FileNotFoundError as exc:
        raise InvalidRequestError(f"no script {name!r} in {scripts_dir}", param="agent.model") from exc
    except (ValidationError, OSError) as exc:
        raise InvalidRequestError(f"script {path} is not valid: {exc}", param="agent.model") from exc


class ScriptedModel(Model):
    """Plays one script; the call ids are derived from the turn and step, so replays match."""

    def __init__(self, script: Script, *, name: str, chunk_chars: int = 8) -> None:
        self.script = script
        self.name = name
        self.chunk_chars = chunk_chars

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        step = self._step(request)
        if step.say:
            for start in range(0, len(step.say), self.chunk_chars):
                yield TextDelta(step.say[start : start + self.chunk_chars])
        calls = tuple(
            ToolCall(call_id=f"call_{request.turn_id.removeprefix('turn_')}_{request.step}_{i}", name=c.call, arguments=c.arguments)
            for i, c in enumerate(step.tool_calls())
        )
        yield ModelResponse(text=step.say, tool_calls=calls)

    def _step(self, request: ModelRequest) -> _Step:
        turns = self.script.turns
        if request.turn_ordinal >= len(turns):
            raise ModelError(
                f"script {self.name!r} has {len(turns)} turn(s); this is turn {request.turn_ordinal + 1}",
                code="invalid_request",
                retryable=False,
            )
        steps = turns[request.turn_ordinal]
        if request.step >= len(steps):
            raise ModelError(
                f"script {self.name!r} ran out in turn {request.turn_ordinal + 1}: it has {len(steps)} step(s), "
                f"the turn needs step {request.step + 1} (end a turn with a `say` step)",
                code="invalid_request",
                retryable=False,
            )
        return steps[request.step]


def script_from_mapping(data: Mapping[str, Any], *, name: str = "inline") -> ScriptedModel:
    """Build a scripted model from an in-memory script (users' tests)."""
    try:
        return ScriptedModel(Script.model_validate(data), name=name)
    except ValidationError as exc:
        raise InvalidRequestError(f"script {name!r} is not valid: {exc}") from exc

