"""`@cairn.tool`: schemas from type hints, hints refused when decorated, arguments validated on
every call, sync and async functions, the context, the output, and the options."""

from __future__ import annotations

import dataclasses
import enum
import sys
import threading
import typing
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

import cairn
from cairn.errors import AgentDefinitionError, InvalidRequestError
from cairn.operator import DEFAULT_APPROVERS, OperatorToolDef, RuntimeDeps

pytestmark = pytest.mark.anyio


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Target(BaseModel):
    host: str
    port: int = 443


class Window(TypedDict):
    start: str
    minutes: int


@cairn.tool
def everything(
    name: str,
    count: int,
    ratio: float,
    dry_run: bool,
    tags: list[str],
    labels: dict[str, int],
    note: str | None,
    mode: Literal["fast", "safe"],
    colour: Colour,
    target: Target,
    window: Window,
    retries: Annotated[int, Field(ge=0, le=5)] = 3,
) -> str:
    """Use every kind of parameter."""
    return "ok"


def _context(**deps: Any) -> cairn.ToolContext:
    return cairn.ToolContext(tenant="t1", session_id="sess_1", turn_id="turn_1", call_id="call_1", deps=RuntimeDeps(deps))


def test_the_name_description_and_schema_come_from_the_function() -> None:
    assert isinstance(everything, OperatorToolDef)
    assert everything.name == "everything"
    assert everything.description == "Use every kind of parameter."
    schema = everything.parameters
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert schema["required"] == ["name", "count", "ratio", "dry_run", "tags", "labels", "note", "mode", "colour", "target", "window"]
    props = schema["properties"]
    assert props["name"] == {"type": "string"}
    assert props["count"] == {"type": "integer"}
    assert props["ratio"] == {"type": "number"}
    assert props["dry_run"] == {"type": "boolean"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["labels"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert props["mode"] == {"enum": ["fast", "safe"], "type": "string"}
    assert props["retries"] == {"default": 3, "maximum": 5, "minimum": 0, "type": "integer"}
    assert props["colour"] == {"$ref": "#/$defs/Colour"} and schema["$defs"]["Colour"]["enum"] == ["red", "blue"]
    assert schema["$defs"]["Target"]["required"] == ["host"]
    assert schema["$defs"]["Window"]["required"] == ["start", "minutes"]


def test_the_context_parameter_is_not_part_of_the_schema() -> None:
    @cairn.tool
    async def deploy(ctx: cairn.ToolContext, release: str) -> str:
        """Deploy."""
        return release

    assert deploy.takes_context
    assert list(deploy.parameters["properties"]) == ["release"]


def test_parameter_names_that_pydantic_models_use_are_fine() -> None:
    @cairn.tool
    def shadowing(model_config: str, json: int, copy: bool = False) -> str:
        """Names a pydantic model has attributes of."""
        return "ok"

    parsed = shadowing.parse({"model_config": "x", "json": 2})
    assert shadowing.keyword_arguments(parsed) == {"model_config": "x", "json": 2, "copy": False}
    assert set(shadowing.parameters["properties"]) == {"model_config", "json", "copy"}


@pytest.mark.parametrize(
    ("hint", "problem"),
    [
        ("set[int]", "set"),
        ("bytes", "bytes"),
        ("Any", "Any"),
        ("list", "bare list"),
        ("dict", "bare dict"),
        ("dict[int, str]", "dict keys of type int"),
        ("list[set[str]]", "set"),
        ("Literal[1.5]", "Literal value 1.5"),
        ("tuple[int, int]", "tuple"),
    ],
)
def test_unsupported_hints_are_refused_when_decorated(hint: str, problem: str) -> None:
    namespace: dict[str, Any] = {"Any": Any, "Literal": Literal}
    exec(f"def bad(x: {hint}) -> str:\n    'Doc.'\n    return ''", namespace)
    with pytest.raises(AgentDefinitionError, match=rf"tool 'bad', parameter 'x': .*{problem}.* is not supported; use str, int"):
        cairn.tool(namespace["bad"])


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="pydantic reads typing.TypedDict from Python 3.12")
def test_a_typing_typed_dict_that_pydantic_cannot_read_is_refused_with_its_reason() -> None:
    class Old(typing.TypedDict):
        start: str

    def old(x: Old) -> str:
        """Doc."""
        return ""

    old.__annotations__["x"] = Old
    with pytest.raises(AgentDefinitionError, match="no JSON schema for its parameters.*typing_extensions.TypedDict"):
        cairn.tool(old)


def test_a_typed_dict_with_an_unsupported_field_is_refused() -> None:
    class Bad(TypedDict):
        when: bytes

    def bad(x: Bad) -> str:
        """Doc."""
        return ""

    bad.__annotations__["x"] = Bad
    with pytest.raises(AgentDefinitionError, match=r"bytes \(in Bad.when\) is not supported"):
        cairn.tool(bad)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(x):\n    'Doc.'", "needs a type hint"),
        ("def f(*x: int):\n    'Doc.'", r"\*args, \*\*kwargs and positional-only"),
        ("def f(**x: int):\n    'Doc.'", r"\*args, \*\*kwargs and positional-only"),
        ("def f(x: int, /):\n    'Doc.'", r"\*args, \*\*kwargs and positional-only"),
        ("def f(_x: int):\n    'Doc.'", "starting with '_'"),
        ("def f(x: int):\n    pass", "needs a docstring"),
        ("def f(x: 'Missing'):\n    'Doc.'", "type hints cannot be resolved"),
        ("def f(x: int, ctx: ToolContext):\n    'Doc.'", "ToolContext parameter must come first"),
        ("def déployer(x: int):\n    'Doc.'", "tool name 'déployer'"),
    ],
)
def test_bad_signatures_are_refused_when_decorated(source: str, message: str) -> None:
    namespace: dict[str, Any] = {"ToolContext": cairn.ToolContext}
    exec(source, namespace)
    function = next(v for k, v in namespace.items() if callable(v) and k != "ToolContext")
    with pytest.raises(AgentDefinitionError, match=message):
        cairn.tool(function)


def test_only_functions_can_be_tools() -> None:
    with pytest.raises(AgentDefinitionError, match="decorates a function"):
        cairn.tool(print)  # type: ignore[arg-type]


def test_arguments_are_validated_and_converted() -> None:
    arguments = {
        "name": "n", "count": 2, "ratio": 0.5, "dry_run": True, "tags": ["a"], "labels": {"a": 1}, "note": None,
        "mode": "safe", "colour": "blue", "target": {"host": "h"}, "window": {"start": "09:00", "minutes": 30},
    }
    parsed = everything.keyword_arguments(everything.parse(arguments))
    assert parsed["colour"] is Colour.BLUE
    assert parsed["target"] == Target(host="h", port=443)
    assert parsed["retries"] == 3
    assert everything.snapshot(everything.parse(arguments))["target"] == {"host": "h", "port": 443}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"count": "many"}, "count: Input should be a valid integer"),
        ({"mode": "reckless"}, "mode: Input should be 'fast' or 'safe'"),
        ({"colour": "green"}, "colour: Input should be 'red' or 'blue'"),
        ({"target": {"port": 1}}, "target.host: Field required"),
        ({"retries": 9}, "retries: Input should be less than or equal to 5"),
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
    ],
)
def test_bad_arguments_are_errors_naming_the_argument(change: dict[str, Any], message: str) -> None:
    arguments = {
        "name": "n", "count": 2, "ratio": 0.5, "dry_run": True, "tags": [], "labels": {}, "note": None,
        "mode": "safe", "colour": "red", "target": {"host": "h"}, "window": {"start": "09:00", "minutes": 30},
    }
    with pytest.raises(InvalidRequestError, match=f"invalid arguments for everything: .*{message}"):
        everything.parse({**arguments, **change})


def test_a_missing_argument_is_named() -> None:
    with pytest.raises(InvalidRequestError, match="name: Field required"):
        everything.parse({})


async def test_an_async_tool_gets_the_context_and_its_arguments() -> None:
    seen: list[Any] = []

    @cairn.tool
    async def deploy(ctx: cairn.ToolContext, release: str, force: bool = False) -> str:
        """Deploy."""
        seen.append((ctx.tenant, ctx.session_id, ctx.call_id, ctx.deps["region"], release, force))
        return f"deployed:{release}"

    result = await deploy.invoke(_context(region="eu"), deploy.parse({"release": "r-1"}))
    assert result == "deployed:r-1"
    assert seen == [("t1", "sess_1", "call_1", "eu", "r-1", False)]


async def test_a_sync_tool_runs_in_a_worker_thread() -> None:
    threads: list[int] = []

    @cairn.tool
    def where(release: str) -> dict[str, Any]:
        """Report the thread."""
        threads.append(threading.get_ident())
        return {"release": release}

    result = await where.invoke(_context(), where.parse({"release": "r-2"}))
    assert result == {"release": "r-2"}
    assert threads and threads[0] != threading.get_ident()
    assert where.render_output(result) == '{"release":"r-2"}'


def test_outputs_are_text_or_json() -> None:
    assert OperatorToolDef.render_output("plain") == "plain"
    assert OperatorToolDef.render_output(Target(host="h")) == '{"host":"h","port":443}'
    assert OperatorToolDef.render_output(None) == "null"
    with pytest.raises(InvalidRequestError, match="not JSON"):
        OperatorToolDef.render_output(object())


def test_a_decorated_function_can_still_be_called_directly() -> None:
    assert everything("n", 1, 0.1, False, [], {}, None, "fast", Colour.RED, Target(host="h"), {"start": "", "minutes": 0}) == "ok"


def test_options() -> None:
    @cairn.tool(needs_approval=True, side_effect=True, approvers=["approver"], approval_ttl=timedelta(minutes=5))
    def guarded(release: str) -> str:
        """Guarded."""
        return release

    assert guarded.side_effect and guarded.policy.needs_approval is True
    assert guarded.policy.approvers == frozenset({"approver"}) and guarded.policy.ttl_s == 300.0
    assert everything.policy.approvers == DEFAULT_APPROVERS and everything.policy.ttl_s is None
    assert not everything.side_effect and not everything.policy.may_need_approval


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"needs_approval": "yes"}, "needs_approval must be True, False or a predicate"),
        ({"approvers": "approver"}, "approvers is a list of roles"),
        ({"approvers": []}, "approvers must name at least one role"),
        ({"approval_ttl": -1}, "approval_ttl must be a positive number"),
        ({"approval_ttl": float("nan")}, "approval_ttl must be a positive number"),
        ({"side_effect": "yes"}, "side_effect must be True or False"),
        ({"review": "everything"}, "review must be a function"),
        ({"key": lambda a: a["release"]}, "key= describes a side effect; set side_effect=True"),
        ({"probe": lambda ctx, a: None}, "probe= describes a side effect"),
        ({"max_attempts": 2}, "max_attempts= describes a side effect"),
        ({"side_effect": True, "key": "release"}, "key must be a function"),
        ({"side_effect": True, "probe": 3}, "probe must be a function"),
        ({"side_effect": True, "max_attempts": 0}, "max_attempts must be a whole number, 1 or more"),
        ({"side_effect": True, "max_attempts": True}, "max_attempts must be a whole number"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], message: str) -> None:
    def fine(release: str) -> str:
        """Fine."""
        return release

    with pytest.raises(AgentDefinitionError, match=message):
        cairn.tool(**options)(fine)


async def test_a_side_effects_key_and_probe_see_the_parsed_arguments() -> None:
    def target(arguments: Mapping[str, Any]) -> str:
        return f"{arguments['region']}/{arguments['release']}"

    async def found(ctx: cairn.ToolContext, arguments: Mapping[str, Any]) -> cairn.ProbeAnswer:
        return cairn.ProbeAnswer.happened({"release": arguments["release"], "key": ctx.operation_key})

    @cairn.tool(side_effect=True, key=target, probe=found, max_attempts=5)
    def deploy(release: str, region: str = "eu") -> str:
        """Deploy."""
        return release

    @cairn.tool(side_effect=True)
    def plain(release: str) -> str:
        """Plain."""
        return release

    parsed = deploy.parse({"release": "r-1"})
    assert deploy.target(parsed) == "eu/r-1" and deploy.effect is not None and deploy.effect.max_attempts == 5
    context = dataclasses.replace(_context(), operation_key="op_1")
    assert await deploy.probe(context, parsed) == cairn.ProbeAnswer.happened({"release": "r-1", "key": "op_1"})
    assert plain.target(plain.parse({"release": "r"})) is None and await plain.probe(context, plain.parse({"release": "r"})) is None
    assert everything.effect is None
    # Only a key changes the tool's description (and so its agent's revision).
    assert "operation_key" in deploy.describe() and "operation_key" not in plain.describe()


async def test_a_probe_that_answers_something_else_is_an_error() -> None:
    @cairn.tool(side_effect=True, probe=lambda ctx, arguments: True)
    def deploy(release: str) -> str:
        """Deploy."""
        return release

    with pytest.raises(InvalidRequestError, match="not a cairn.ProbeAnswer"):
        await deploy.probe(_context(), deploy.parse({"release": "r-1"}))
