"""What the approvals tests share: an operator agent whose `write_file` calls need approval,
sessions pinned to it, keys that decide, and the approvals stored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cairn
from cairn.engine.approvals import Decision, DecisionRequest, decide
from cairn.engine.approvals.sealed import open_state, state_view
from cairn.engine.loop.model_input import item_input
from cairn.engine.tools.workspace import BUILTIN_TOOLS
from cairn.models.base import FunctionCallOutputInput
from cairn.operator import ApprovalPolicy, LoadedAgent, LoadedAgents
from cairn.store.approvals import ApprovalRecord, Decider, get_call_approval, list_approvals
from cairn.store.keys import create_key
from tests.unit.engine.harness import EngineHarness

VERSION = "release-agent/v1"


def release_agents(
    *,
    instructions: str = "You ship releases.",
    approvers: frozenset[str] = frozenset({"admin", "approver"}),
    ttl_s: float | None = None,
) -> LoadedAgents:
    """The release agent: its `write_file` calls need approval; the approver sees the path."""
    policy = ApprovalPolicy.of("write_file", needs_approval=True, approvers=approvers, approval_ttl=ttl_s, review=_path_only)
    agent = cairn.Agent(model="scripted:test", instructions=instructions, tools=["write_file", "read_file"],
                        approvals={"write_file": policy})
    return LoadedAgents([LoadedAgent(VERSION, agent, BUILTIN_TOOLS)])


def _path_only(arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {"path": arguments["path"]}


def write(path: str) -> dict[str, Any]:
    return {"call": "write_file", "arguments": {"path": path, "content": f"{path}\n"}}


async def open_gated(engine: EngineHarness, agents: LoadedAgents) -> None:
    """A (re)started process that loaded `agents` and gates calls by their approval policy."""
    engine.gated = True
    await engine.restart(agents=agents)


async def pinned_session(engine: EngineHarness) -> str:
    """A session of the release agent (pinned to its version), with one queued turn."""
    return await engine.create_session(agent_id="release-agent")


async def key(engine: EngineHarness, role: str = "approver", tenant: str = "t1") -> Decider:
    async with engine.runtime.db.write() as conn:
        record, _ = await create_key(conn, tenant=tenant, role=role)
    return Decider(key_id=record.id, tenant=tenant, role=role)


async def approvals(engine: EngineHarness, session_id: str) -> list[ApprovalRecord]:
    """The session's approvals, their sealed state opened."""
    async with engine.runtime.db.read() as conn:
        page = await list_approvals(conn, "t1", session_id=session_id, after=None, order="asc", limit=100)
        return [await open_state(engine.runtime.sealer, conn, a) for a in page.data]


async def approval_of(engine: EngineHarness, turn_id: str, call_id: str) -> ApprovalRecord:
    """The call's approval, its sealed state opened (as stored when it is deleted or does not open)."""
    async with engine.runtime.db.read() as conn:
        found = await get_call_approval(conn, turn_id, call_id)
        assert found is not None, f"no approval for call {call_id}"
        return (await state_view(engine.runtime.sealer, conn, found))[0]


async def approve(engine: EngineHarness, decider: Decider, approval: ApprovalRecord) -> ApprovalRecord:
    request = DecisionRequest(Decision.APPROVE, arguments_digest=approval.arguments_digest)
    return await decide(engine.runtime.journal, decider, approval.id, request)


async def call_result(engine: EngineHarness, session_id: str, call_id: str) -> tuple[str | None, str]:
    """The call's item status and the result the model is shown for it (an `mcp_call` carries
    its result; a `function_call` has an output item after it)."""
    found = [i for i in await engine.items(session_id) if i.call_id == call_id]
    call = next(i for i in found if i.type != "function_call_output")
    shown = [e for i in found for e in item_input(i) if isinstance(e, FunctionCallOutputInput)]
    return call.status, shown[-1].output if shown else ""
