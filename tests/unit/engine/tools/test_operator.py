"""Registered agents in the engine: a session pinned to a version at create, its toolbox (the
version's built-ins and operator tools), operator tools run in the worker with their context,
tool errors the model sees, calls an approval policy covers recorded as `mcp_call`, and a
turn whose pinned version is missing or changed failing before it starts."""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
import pytest
from openai._models import construct_type
from openai.types.beta.agent_mcp_call_item import AgentMcpCallItem
from openai.types.beta.agent_output_item import AgentOutputItem
from openai.types.beta.agent_session_item import AgentSessionItem

import cairn
from cairn.engine.loop.model_input import item_input
from cairn.engine.loop.recovery import INTERRUPTED
from cairn.engine.loop.step import session_toolbox
from cairn.engine.sessions import SessionService
from cairn.engine.tools.operator import AgentTool, OperatorTool
from cairn.engine.tools.workspace import BUILTIN_TOOLS
from cairn.engine.wire import render_session
from cairn.errors import InvalidRequestError
from cairn.models.base import FunctionCallInput, FunctionCallOutputInput
from cairn.operator import LoadedAgent, LoadedAgents, RuntimeDeps
from cairn.store.items import ItemRecord
from tests.unit.engine.harness import EngineHarness

pytestmark = pytest.mark.anyio


@cairn.tool(side_effect=True)
async def deploy_release(ctx: cairn.ToolContext, release: str) -> str:
    """Deploy a release to production."""
    ctx.deps["ledger"].append(
        {"tenant": ctx.tenant, "session": ctx.session_id, "turn": ctx.turn_id, "call": ctx.call_id, "approval": ctx.approval, "release": release}
    )
    return f"deployed:{release}"


@cairn.tool
def rollback(release: str) -> str:
    """Roll a release back."""
    raise RuntimeError(f"release {release} has no previous version")


@cairn.tool(needs_approval=True, approvers=["approver"])
def refund(order: str, amount: int) -> dict[str, Any]:
    """Refund an order."""
    return {"order": order, "refunded": amount}


@cairn.tool(needs_approval=True)
async def hang(ctx: cairn.ToolContext) -> str:
    """Wait until the worker dies."""
    ctx.deps["crash"]()
    await anyio.Event().wait()
    return "never"


def _agents(ledger: list[dict[str, Any]] | None = None, *, instructions: str = "You ship releases.", **deps: Any) -> LoadedAgents:
    v1 = cairn.Agent(model="scripted:test", instructions="Old.", tools=[deploy_release])
    v2 = cairn.Agent(
        model="scripted:test",
        instructions=instructions,
        tools=[deploy_release, "shell", rollback, refund, hang, "read_file"],
        approvals={"shell": cairn.commands_matching(r"^git push"), "read_file": True},
    )
    loaded = [LoadedAgent("release-agent/v1", v1, BUILTIN_TOOLS), LoadedAgent("release-agent/v2", v2, BUILTIN_TOOLS)]
    return LoadedAgents(loaded, RuntimeDeps({"ledger": ledger if ledger is not None else [], **deps}))


async def _registered(engine: EngineHarness, **deps: Any) -> list[dict[str, Any]]:
    """A runtime with the release agents loaded; the tools' effects go to the list returned."""
    ledger: list[dict[str, Any]] = []
    await engine.restart(agents=_agents(ledger, **deps))
    engine.script([{"say": "unused"}])
    return ledger


def _calls(items: list[ItemRecord]) -> list[ItemRecord]:
    return [i for i in items if i.call_id is not None]


# -- create: pinning and the session's agent ----------------------------------------------------


async def test_a_session_of_a_registered_agent_pins_its_newest_version(engine: EngineHarness) -> None:
    await _registered(engine)
    session = await engine.session(await engine.create_session(agent_id="release-agent"))
    newest = engine.runtime.agents.newest("release-agent")
    assert newest is not None
    assert (session.agent_version, session.agent_revision) == ("release-agent/v2", newest.revision)
    agent = render_session(session)["agent"]
    assert agent["id"] == agent["name"] == "release-agent"
    assert agent["model"] == "scripted:test" and agent["instructions"] == "You ship releases."
    assert agent["version"] == "release-agent/v2" and agent["revision"] == newest.revision
    assert [t["name"] for t in agent["tools"]] == ["deploy_release", "rollback", "refund", "hang"]
    assert agent["tools"][0] == {
        "type": "function", "name": "deploy_release", "description": "Deploy a release to production.",
        "parameters": deploy_release.parameters, "defer_loading": False,
    }


async def test_fields_of_agent_override_the_version_and_function_tools_are_client_tools(engine: EngineHarness) -> None:
    await _registered(engine)
    lookup = {"type": "function", "name": "lookup", "description": "Look up", "parameters": {"type": "object", "properties": {}}}
    body = {
        "agent_id": "release-agent",
        "agent": {"instructions": "Be brief.", "reasoning": {"effort": "low"}, "tools": [lookup]},
        "environment": {"type": "openai_hosted"},
    }
    session = (await SessionService(engine.runtime).create("t1", body)).session
    assert session.agent["instructions"] == "Be brief." and session.agent["reasoning"] == {"effort": "low"}
    assert [t["name"] for t in session.agent["tools"]] == ["deploy_release", "rollback", "refund", "hang", "lookup"]
    toolbox = session_toolbox(engine.runtime, session)
    assert toolbox.get("lookup").kind == "client" and toolbox.get("deploy_release").kind == "operator"


@pytest.mark.parametrize(
    ("agent", "message", "param"),
    [
        ({"tools": [{"type": "function", "name": "deploy_release"}]}, "'deploy_release' is taken by a tool of agent release-agent", "agent.tools[0].name"),
        ({"tools": [{"type": "function", "name": "shell"}]}, "'shell' is taken by a built-in workspace tool", "agent.tools[0].name"),
        ({"model": "scripted:nope"}, "no script 'nope'", "agent.model"),
    ],
)
async def test_create_refuses_what_does_not_fit_the_registered_agent(
    engine: EngineHarness, agent: dict[str, Any], message: str, param: str
) -> None:
    await _registered(engine)
    body = {"agent_id": "release-agent", "agent": agent, "environment": {"type": "openai_hosted"}}
    with pytest.raises(InvalidRequestError, match=message) as refused:
        await SessionService(engine.runtime).create("t1", body)
    assert refused.value.param == param


async def test_an_unknown_agent_id_is_refused_naming_it(engine: EngineHarness) -> None:
    body = {"agent_id": "release-agent", "agent": {}, "environment": {"type": "openai_hosted"}}
    with pytest.raises(InvalidRequestError, match="unknown agent_id 'release-agent'.*started without --agents") as refused:
        await SessionService(engine.runtime).create("t1", body)
    assert refused.value.param == "agent_id"
    await _registered(engine)
    with pytest.raises(InvalidRequestError, match="unknown agent_id 'ship-agent'.*registered agents: release-agent"):
        await SessionService(engine.runtime).create("t1", {**body, "agent_id": "ship-agent"})


async def test_an_update_of_the_tools_keeps_the_agents_own(engine: EngineHarness) -> None:
    await _registered(engine)
    session_id = await engine.create_session(agent_id="release-agent")
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    service = SessionService(engine.runtime)
    updated = await service.update("t1", session_id, {"agent": {"tools": [lookup]}})
    assert [t["name"] for t in updated.agent["tools"]] == ["deploy_release", "rollback", "refund", "hang", "lookup"]
    assert (updated.agent_version, updated.agent_revision) == ((await engine.session(session_id)).agent_version, updated.agent_revision)
    with pytest.raises(InvalidRequestError, match="taken by a tool of agent release-agent"):
        await service.update("t1", session_id, {"agent": {"tools": [{"type": "function", "name": "refund"}]}})


# -- the toolbox ------------------------------------------------------------------------------


async def test_the_toolbox_has_the_versions_tools_in_its_order(engine: EngineHarness) -> None:
    await _registered(engine)
    session = await engine.session(await engine.create_session(agent_id="release-agent"))
    toolbox = session_toolbox(engine.runtime, session)
    assert [(s.name, s.kind) for s in toolbox.specs] == [
        ("deploy_release", "operator"), ("shell", "workspace"), ("rollback", "operator"), ("refund", "operator"),
        ("hang", "operator"), ("read_file", "workspace"),
    ]
    assert all(isinstance(toolbox.get(s.name), AgentTool) for s in toolbox.specs)
    assert isinstance(toolbox.get("deploy_release").tool, OperatorTool)  # type: ignore[attr-defined]
    # A read the policy may hold is recorded before it runs, never run ahead of its record.
    assert not toolbox.get("read_file").is_read_only
    assert toolbox.get("write_file").name == "write_file" and not isinstance(toolbox.get("write_file"), AgentTool)


async def test_without_a_workspace_only_operator_tools_remain(engine: EngineHarness) -> None:
    await _registered(engine)
    session = await engine.session(await engine.create_session(agent_id="release-agent", workspace=False))
    assert [s.name for s in session_toolbox(engine.runtime, session).specs] == ["deploy_release", "rollback", "refund", "hang"]


# -- running operator tools ---------------------------------------------------------------------


async def test_an_operator_tool_runs_in_the_worker_with_its_context(engine: EngineHarness) -> None:
    ledger = await _registered(engine)
    engine.script([{"call": "deploy_release", "arguments": {"release": "r-42"}}, {"say": "shipped"}])
    session_id = await engine.create_session(agent_id="release-agent")
    await engine.run_job()

    items = await engine.items(session_id)
    call, output = _calls(items)
    assert (call.type, call.status, call.tool_kind) == ("function_call", "completed", "operator")
    assert (output.type, output.data["output"]) == ("function_call_output", "deployed:r-42")
    turn_id = engine.turn_ids[session_id]
    assert ledger == [{"tenant": "t1", "session": session_id, "turn": turn_id, "call": call.call_id, "approval": None, "release": "r-42"}]
    assert (await engine.turn(turn_id)).status == "completed"
    assert engine.sandbox.commands == []  # not in the sandbox


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ({"call": "deploy_release", "arguments": {"release": 42}}, "invalid arguments for deploy_release: release: Input should be a valid string"),
        ({"call": "deploy_release", "arguments": {}}, "invalid arguments for deploy_release: release: Field required"),
        ({"call": "rollback", "arguments": {"release": "r-1"}}, "release r-1 has no previous version"),
        ({"call": "write_file", "arguments": {"path": "a", "content": "b"}}, "unknown tool 'write_file'; available tools: deploy_release, shell"),
    ],
)
async def test_tool_errors_are_results_the_model_sees(
    engine: EngineHarness, caplog: pytest.LogCaptureFixture, call: dict[str, Any], error: str
) -> None:
    ledger = await _registered(engine)
    engine.script([call, {"say": "sorry"}])
    session_id = await engine.create_session(agent_id="release-agent")
    with caplog.at_level(logging.ERROR, logger="cairn.engine.tools.operator"):
        await engine.run_job()
    output = next(i for i in await engine.items(session_id) if i.type == "function_call_output")
    assert output.status == "failed" and output.data["error"].startswith(error)
    assert ledger == []
    assert (await engine.turn(engine.turn_ids[session_id])).status == "completed"
    raised = [r for r in caplog.records if r.exc_info is not None]
    assert bool(raised) is (call["call"] == "rollback")  # a raising tool is logged with its traceback


async def test_a_call_the_policy_covers_is_recorded_as_an_mcp_call(engine: EngineHarness) -> None:
    await _registered(engine)
    engine.script([{"call": "refund", "arguments": {"order": "o-7", "amount": 30}}, {"say": "refunded"}])
    session_id = await engine.create_session(agent_id="release-agent")
    batches = await engine.run_job()

    calls = _calls(await engine.items(session_id))
    assert len(calls) == 1, "an mcp_call carries its result: no output item"
    call = calls[0]
    assert (call.type, call.status, call.tool_kind) == ("mcp_call", "completed", "operator")
    assert call.data == {
        "server_label": "release-agent", "name": "refund", "arguments": '{"order": "o-7", "amount": 30}',
        "output": '{"order":"o-7","refunded":30}', "error": None,
    }
    events = [e for batch in batches for e in batch if e.get("item", {}).get("type") == "mcp_call"]
    assert [(e["type"].rsplit(".", 1)[-1], e["item"]["status"]) for e in events] == [("added", "in_progress"), ("done", "completed")]
    assert item_input(call) == [
        FunctionCallInput(call_id=str(call.call_id), name="refund", arguments='{"order": "o-7", "amount": 30}'),
        FunctionCallOutputInput(call_id=str(call.call_id), output='{"order":"o-7","refunded":30}'),
    ]
    # The official client reads it, in item lists and in item.done events alike.
    for union in (AgentSessionItem, AgentOutputItem):
        parsed = construct_type(value=call.wire(), type_=union)
        assert isinstance(parsed, AgentMcpCallItem)
        assert (parsed.server_label, parsed.name, parsed.status, parsed.error) == ("release-agent", "refund", "completed", None)
        assert json.loads(str(parsed.arguments)) == {"order": "o-7", "amount": 30}


async def test_a_builtin_call_its_policy_covers_is_an_mcp_call_with_the_commands_result(engine: EngineHarness) -> None:
    await _registered(engine)
    engine.sandbox.replies["git push origin main"] = ([b"pushed\n"], 0)
    engine.sandbox.replies["ls"] = ([b"a b\n"], 0)
    calls = [{"call": "shell", "arguments": {"command": "git push origin main"}}, {"call": "shell", "arguments": {"command": "ls"}}]
    engine.script([{"calls": calls}, {"say": "done"}])
    session_id = await engine.create_session(agent_id="release-agent")
    await engine.run_job()

    push, listing = _calls(await engine.items(session_id))
    assert (push.type, push.status, push.tool_kind) == ("mcp_call", "completed", "workspace")
    assert push.data["name"] == "shell" and push.data["output"] == "pushed\n" and push.data["exit_code"] == 0
    assert item_input(push)[1] == FunctionCallOutputInput(call_id=str(push.call_id), output="exit_code: 0\npushed\n")
    assert (listing.type, listing.data["output"]) == ("command_execution", "a b\n")


async def test_a_failed_mcp_call_shows_its_error(engine: EngineHarness) -> None:
    await _registered(engine)
    engine.script([{"call": "refund", "arguments": {"order": "o-7"}}, {"say": "sorry"}])
    session_id = await engine.create_session(agent_id="release-agent")
    await engine.run_job()
    (call,) = _calls(await engine.items(session_id))
    assert (call.type, call.status, call.data["output"]) == ("mcp_call", "failed", None)
    assert call.data["error"].startswith("invalid arguments for refund: amount: Field required")
    assert item_input(call)[1].output.startswith("error: invalid arguments for refund")  # type: ignore[union-attr]


async def test_an_mcp_call_left_open_by_a_dead_worker_is_closed_as_interrupted(engine: EngineHarness) -> None:
    crash = anyio.CancelScope()
    await _registered(engine, crash=crash.cancel)
    engine.script([{"call": "hang", "arguments": {}}, {"say": "done"}])
    session_id = await engine.create_session(agent_id="release-agent")
    with crash:
        await engine.run_job(lease_s=-1)
    assert crash.cancelled_caught, "the worker never reached the tool"

    await engine.restart()
    await engine.run_job()
    (call,) = _calls(await engine.items(session_id))
    assert (call.type, call.status, call.data["error"]) == ("mcp_call", "incomplete", INTERRUPTED)
    assert (await engine.turn(engine.turn_ids[session_id])).status == "completed"


# -- the pinned version -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("agents", "message"),
    [
        (LoadedAgents(), "pinned to agent version release-agent/v2, which this worker does not have"),
        (_agents(instructions="Ship with care."), "agent version release-agent/v2 changed since this session pinned it"),
    ],
)
async def test_a_worker_without_the_pinned_version_unchanged_fails_the_turn(
    engine: EngineHarness, agents: LoadedAgents, message: str
) -> None:
    ledger = await _registered(engine)
    engine.script([{"call": "deploy_release", "arguments": {"release": "r-1"}}, {"say": "done"}])
    session_id = await engine.create_session(agent_id="release-agent")
    await engine.restart(agents=agents)
    await engine.run_job()
    turn = await engine.turn(engine.turn_ids[session_id])
    assert turn.status == "failed" and turn.error is not None
    assert turn.error["code"] == "executor_version_incompatible" and message in turn.error["message"]
    assert ledger == [] and (await engine.session(session_id)).status == "idle"


async def test_a_session_stays_on_its_version_when_a_newer_one_is_registered(engine: EngineHarness) -> None:
    await _registered(engine)
    engine.script([{"call": "deploy_release", "arguments": {"release": "r-1"}}, {"say": "done"}])
    session_id = await engine.create_session(agent_id="release-agent")
    current = engine.runtime.agents.all()
    v3 = LoadedAgent("release-agent/v3", cairn.Agent(model="scripted:test", tools=[]), BUILTIN_TOOLS)
    ledger: list[dict[str, Any]] = []
    await engine.restart(agents=LoadedAgents([*current, v3], RuntimeDeps({"ledger": ledger})))
    await engine.run_job()
    assert [entry["release"] for entry in ledger] == ["r-1"]
    assert (await engine.session(session_id)).agent_version == "release-agent/v2"

