"""`@cairn.tool`: a Python function of the operator's as a tool the model can call.

The name is the function's, the description its docstring, the JSON schema comes from the
parameters' type hints (checked when the function is decorated), and every call's arguments
are validated against it with pydantic before the function runs. A first parameter annotated
`cairn.ToolContext` receives the call's context. Sync and async functions both work: a sync one
runs in a worker thread, so it never blocks the event loop. The tool runs in the worker
process (it is the operator's trusted code), never in the sandbox.

    @cairn.tool(needs_approval=True, side_effect=True, approvers=["approver"])
    async def deploy_release(ctx: cairn.ToolContext, release: str) -> str:
        \"\"\"Deploy a release to production.\"\"\"

A `side_effect=True` tool runs under the idempotency ledger; `key=`, `probe=` and
`max_attempts=` tell the ledger about its effect (`cairn.operator.effects`, docs/ledger.md).
"""

from __future__ import annotations

import copy
import inspect
import re
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Generic, ParamSpec, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import PydanticSerializationError, to_json

from cairn._concurrency import run_sync
from cairn._validation import validation_problems
from cairn.errors import AgentDefinitionError, InvalidRequestError
from cairn.operator.context import ToolContext
from cairn.operator.effects import KeyFunction, Probe, ProbeAnswer
from cairn.operator.hints import SUPPORTED, unsupported_part
from cairn.operator.policy import ApprovalPolicy, Predicate, ReviewBuilder, callable_identity

__all__ = ["OperatorToolDef", "SideEffect", "tool"]

P = ParamSpec("P")
R = TypeVar("R")

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class SideEffect:
    """What the ledger knows of a `side_effect=True` tool's effect (`cairn.operator.effects`)."""

    key: KeyFunction | None = None
    probe: Probe | None = None
    # Executions of one call at most (a `RetryableToolError` is retried up to it); None: the
    # deployment's setting.
    max_attempts: int | None = None

    def describe(self) -> dict[str, Any]:
        """The part of the tool's description that changes its operation keys (for the revision):
        only a key function does, and only a tool with one shows it, so a tool without keeps the
        revision it had before the ledger existed."""
        return {} if self.key is None else {"operation_key": callable_identity(self.key)}


@dataclass(frozen=True, slots=True)
class _Parameter:
    name: str  # as the model and the function know it
    field: str  # the field of the arguments model (never clashes with pydantic's own names)


class OperatorToolDef(Generic[P, R]):
    """A decorated function: its spec, its argument model and its options. Calling it calls
    the function unchanged (handy in the operator's own tests)."""

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        policy: ApprovalPolicy,
        side_effect: bool,
        effect: SideEffect | None = None,
    ) -> None:
        self.fn = fn
        self.name = _tool_name(fn)
        self.description = _description(fn, self.name)
        self.policy = policy
        self.side_effect = side_effect
        # How the ledger treats the effect; None for a tool without one (side_effect=False).
        self.effect = (effect or SideEffect()) if side_effect else None
        self.takes_context, parameters, fields = _signature(fn, self.name)
        self._parameters = parameters
        self._model, self.parameters = _arguments_model(self.name, fields)
        self.is_async = inspect.iscoroutinefunction(fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<cairn tool {self.name}>"

    def parse(self, arguments: Mapping[str, Any]) -> BaseModel:
        """The call's arguments validated; raises `InvalidRequestError` naming every problem."""
        try:
            return self._model.model_validate(dict(arguments))
        except ValidationError as exc:
            raise InvalidRequestError(f"invalid arguments for {self.name}: {validation_problems(exc)}") from exc

    def keyword_arguments(self, parsed: BaseModel) -> dict[str, Any]:
        """The function's keyword arguments (its parameters' names) from validated arguments."""
        return {p.name: getattr(parsed, p.field) for p in self._parameters}

    def snapshot(self, parsed: BaseModel) -> dict[str, Any]:
        """The validated arguments as JSON (defaults filled in): what an approver sees by default."""
        return dict(parsed.model_dump(mode="json", by_alias=True))

    async def invoke(self, ctx: ToolContext, parsed: BaseModel) -> R:
        """Run the function with validated arguments (a sync one in a worker thread)."""
        args: tuple[Any, ...] = (ctx,) if self.takes_context else ()
        kwargs = self.keyword_arguments(parsed)
        fn: Callable[..., Any] = self.fn
        if self.is_async:
            return typing.cast(R, await typing.cast(Awaitable[Any], fn(*args, **kwargs)))
        return typing.cast(R, await run_sync(fn, *args, **kwargs))

    def target(self, parsed: BaseModel) -> Any:
        """The call's target by the tool's `key=` function (None without one)."""
        if self.effect is None or self.effect.key is None:
            return None
        return self.effect.key(self.keyword_arguments(parsed))

    async def probe(self, ctx: ToolContext, parsed: BaseModel) -> ProbeAnswer | None:
        """Ask the tool's probe whether the call took effect; None when it has no probe."""
        if self.effect is None or self.effect.probe is None:
            return None
        probe: Callable[..., Any] = self.effect.probe
        arguments = self.keyword_arguments(parsed)
        if inspect.iscoroutinefunction(probe):
            answer = await probe(ctx, arguments)
        else:
            answer = await run_sync(probe, ctx, arguments)
            if inspect.isawaitable(answer):
                answer = await answer
        if not isinstance(answer, ProbeAnswer):
            raise InvalidRequestError(f"the probe of {self.name} returned {type(answer).__name__}, not a cairn.ProbeAnswer")
        return answer

    @staticmethod
    def render_output(value: Any) -> str:
        """What the model reads: a string as it is, anything else as JSON."""
        if isinstance(value, str):
            return value
        try:
            return to_json(value).decode()
        except PydanticSerializationError as exc:
            raise InvalidRequestError(f"the tool returned a value that is not JSON: {exc}") from exc

    def describe(self) -> dict[str, Any]:
        """The tool as stable JSON: what the model sees and its options (for the revision and the API)."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": copy.deepcopy(self.parameters),
            "side_effect": self.side_effect,
            "approval": self.policy.describe(),
            **(self.effect.describe() if self.effect is not None else {}),
        }


@overload
def tool(fn: Callable[P, R], /) -> OperatorToolDef[P, R]: ...


@overload
def tool(
    *,
    needs_approval: bool | Predicate = False,
    side_effect: bool = False,
    approval_ttl: float | timedelta | None = None,
    approvers: Iterable[str] | None = None,
    review: ReviewBuilder | None = None,
    key: KeyFunction | None = None,
    probe: Probe | None = None,
    max_attempts: int | None = None,
) -> Callable[[Callable[P, R]], OperatorToolDef[P, R]]: ...


def tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    needs_approval: bool | Predicate = False,
    side_effect: bool = False,
    approval_ttl: float | timedelta | None = None,
    approvers: Iterable[str] | None = None,
    review: ReviewBuilder | None = None,
    key: KeyFunction | None = None,
    probe: Probe | None = None,
    max_attempts: int | None = None,
) -> OperatorToolDef[P, R] | Callable[[Callable[P, R]], OperatorToolDef[P, R]]:
    """Make `fn` a tool; usable bare (`@cairn.tool`) or with options.

    `needs_approval`: True, False, or a predicate over the parsed arguments (a mapping of
    parameter names to values). `side_effect`: the call changes something outside Cairn; it
    runs under the idempotency ledger. `approval_ttl`: how long an approval request stays open
    (seconds or a timedelta; default: the deployment's). `approvers`: the roles that may decide
    (default admin and approver). `review`: builds the redacted snapshot an approver sees from
    the parsed arguments (default: the arguments). For a side-effecting tool: `key`, the call's
    target from its parsed arguments (part of its operation key); `probe`, whether a call whose
    worker died took effect; `max_attempts`, executions of one call at most (default: the
    deployment's)."""

    def decorate(function: Callable[P, R]) -> OperatorToolDef[P, R]:
        owner = f"tool {getattr(function, '__name__', function)!r}"
        if not isinstance(side_effect, bool):
            raise AgentDefinitionError(f"{owner}: side_effect must be True or False, not {side_effect!r}")
        policy = ApprovalPolicy.of(owner, needs_approval=needs_approval, approvers=approvers, approval_ttl=approval_ttl, review=review)
        effect = _side_effect(owner, side_effect, key=key, probe=probe, max_attempts=max_attempts)
        return OperatorToolDef(function, policy=policy, side_effect=side_effect, effect=effect)

    if fn is not None:
        return decorate(fn)
    return decorate


def _side_effect(
    owner: str, side_effect: bool, *, key: KeyFunction | None, probe: Probe | None, max_attempts: int | None
) -> SideEffect | None:
    """The checked ledger options; they only mean something for a side-effecting tool."""
    given = [name for name, value in (("key", key), ("probe", probe), ("max_attempts", max_attempts)) if value is not None]
    if not side_effect:
        if given:
            raise AgentDefinitionError(f"{owner}: {given[0]}= describes a side effect; set side_effect=True")
        return None
    for name, value in (("key", key), ("probe", probe)):
        if value is not None and not callable(value):
            raise AgentDefinitionError(f"{owner}: {name} must be a function, not {value!r}")
    if max_attempts is not None and (isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1):
        raise AgentDefinitionError(f"{owner}: max_attempts must be a whole number, 1 or more, not {max_attempts!r}")
    return SideEffect(key=key, probe=probe, max_attempts=max_attempts)


def _tool_name(fn: Callable[..., Any]) -> str:
    if not inspect.isfunction(fn):
        raise AgentDefinitionError(f"@cairn.tool decorates a function (def or async def), not {fn!r}")
    name = fn.__name__
    if not TOOL_NAME.fullmatch(name):
        raise AgentDefinitionError(f"tool name {name!r}: use 1 to 64 ASCII letters, digits, '_' or '-'")
    return name


def _description(fn: Callable[..., Any], name: str) -> str:
    description = inspect.getdoc(fn)
    if not description:
        raise AgentDefinitionError(f"tool {name!r} needs a docstring: it is the description the model reads")
    return description


def _signature(fn: Callable[..., Any], name: str) -> tuple[bool, list[_Parameter], dict[str, Any]]:
    """Whether `fn` takes the context first, its parameters, and the arguments model's fields."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise AgentDefinitionError(f"tool {name!r}: its type hints cannot be resolved ({type(exc).__name__}: {exc})") from exc
    parameters = list(inspect.signature(fn).parameters.values())
    takes_context = bool(parameters) and hints.get(parameters[0].name) is ToolContext
    if takes_context:
        parameters = parameters[1:]
    found: list[_Parameter] = []
    fields: dict[str, Any] = {}
    for index, param in enumerate(parameters):
        where = f"tool {name!r}, parameter {param.name!r}"
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise AgentDefinitionError(f"{where}: *args, **kwargs and positional-only parameters are not supported")
        if param.name.startswith("_"):
            raise AgentDefinitionError(f"{where}: a name starting with '_' cannot be an argument the model sends")
        if param.name not in hints:
            raise AgentDefinitionError(f"{where}: needs a type hint (the model's arguments are checked against it)")
        hint = hints[param.name]
        if hint is ToolContext:
            raise AgentDefinitionError(f"{where}: the cairn.ToolContext parameter must come first")
        problem = unsupported_part(hint)
        if problem is not None:
            raise AgentDefinitionError(f"{where}: {problem} is not supported; use {SUPPORTED}")
        default = ... if param.default is param.empty else param.default
        field = f"p{index}"
        found.append(_Parameter(param.name, field))
        fields[field] = (Annotated[hint, Field(alias=param.name)], default)
    return takes_context, found, fields


def _arguments_model(name: str, fields: Mapping[str, Any]) -> tuple[type[BaseModel], dict[str, Any]]:
    """The pydantic model that validates a call's arguments, and its JSON schema."""
    try:
        model: type[BaseModel] = create_model(
            f"{name}_arguments", __config__=ConfigDict(extra="forbid", protected_namespaces=()), **fields
        )
        schema = model.model_json_schema(by_alias=True)
    except Exception as exc:
        raise AgentDefinitionError(f"tool {name!r}: no JSON schema for its parameters ({exc})") from exc
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return model, schema
