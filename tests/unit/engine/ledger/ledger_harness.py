"""What the ledger's engine tests share: a deploy system outside Cairn that counts every real
execution (and can fail, or kill the worker right after the effect), side-effecting tools
over it (with a probe, without one, needing approval), sessions pinned to their agent, and
the ledger's entries as stored."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import anyio

import cairn
from cairn.engine.ledger import shown_result
from cairn.engine.tools.workspace import BUILTIN_TOOLS
from cairn.operator import LoadedAgent, LoadedAgents, RuntimeDeps
from cairn.store.ledger import LedgerEntry, list_entries
from tests.unit.engine.harness import EngineHarness


class Deployer:
    """The system the tools change: what it really deployed, under which operation key."""

    def __init__(self) -> None:
        self.deployed: list[tuple[str, str | None]] = []
        self.keys_seen: list[str | None] = []
        # Raised, in order, by the next calls for a target, before any effect.
        self.failures: dict[str, list[Exception]] = {}
        # Called right after the next effect: the worker dies there (the test's cancel scope).
        self.crash_after_effect: Callable[[], None] | None = None
        # Called before the next effect: the worker dies with nothing done.
        self.crash_before_effect: Callable[[], None] | None = None
        # What the probe answers when it does not find the effect ("did_not_happen" or a reason).
        self.probe_miss = "did_not_happen"
        self.output = "deployed:{release}"

    async def deploy(self, ctx: cairn.ToolContext, release: str) -> str:
        self.keys_seen.append(ctx.operation_key)
        if self.crash_before_effect is not None:
            crash, self.crash_before_effect = self.crash_before_effect, None
            crash()
            await anyio.sleep_forever()
        if self.failures.get(release):
            raise self.failures[release].pop(0)
        self.deployed.append((release, ctx.operation_key))
        if self.crash_after_effect is not None:
            crash, self.crash_after_effect = self.crash_after_effect, None
            crash()
            await anyio.sleep_forever()
        return self.output.format(release=release)

    def probe(self, ctx: cairn.ToolContext, release: str) -> cairn.ProbeAnswer:
        if any(key == ctx.operation_key for _, key in self.deployed):
            return cairn.ProbeAnswer.happened(f"deployed:{release} (found by the probe)")
        if self.probe_miss == "did_not_happen":
            return cairn.ProbeAnswer.did_not_happen()
        return cairn.ProbeAnswer.unsure(self.probe_miss)


def _probe(ctx: cairn.ToolContext, arguments: Mapping[str, Any]) -> cairn.ProbeAnswer:
    deployer: Deployer = ctx.deps["deployer"]
    return deployer.probe(ctx, arguments["release"])


def _release(arguments: Mapping[str, Any]) -> Any:
    return arguments["release"]


@cairn.tool(side_effect=True, key=_release, probe=_probe)
async def deploy_release(ctx: cairn.ToolContext, release: str, note: str = "") -> str:
    """Deploy a release to production."""
    deployer: Deployer = ctx.deps["deployer"]
    return await deployer.deploy(ctx, release)


@cairn.tool(side_effect=True, key=_release)
async def deploy_unprobed(ctx: cairn.ToolContext, release: str) -> str:
    """Deploy a release; nobody can look up afterwards whether it happened."""
    deployer: Deployer = ctx.deps["deployer"]
    return await deployer.deploy(ctx, release)


@cairn.tool(side_effect=True, needs_approval=True, approvers=["approver"], key=_release, probe=_probe)
async def deploy_approved(ctx: cairn.ToolContext, release: str) -> str:
    """Deploy a release once a person approved it."""
    deployer: Deployer = ctx.deps["deployer"]
    return await deployer.deploy(ctx, release)


@cairn.tool(side_effect=True, max_attempts=2)
async def notify(ctx: cairn.ToolContext, channel: str) -> str:
    """Post to a channel (two attempts at most)."""
    deployer: Deployer = ctx.deps["deployer"]
    return await deployer.deploy(ctx, channel)


def release_agents(deployer: Deployer) -> LoadedAgents:
    agent = cairn.Agent(model="scripted:test", instructions="You ship releases.",
                        tools=[deploy_release, deploy_unprobed, deploy_approved, notify])
    return LoadedAgents([LoadedAgent("release-agent/v1", agent, BUILTIN_TOOLS)], RuntimeDeps({"deployer": deployer}))


def call(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"call": tool, "arguments": arguments}


async def open_ledger(engine: EngineHarness, deployer: Deployer, *, gated: bool = False) -> None:
    """A (re)started process that loaded the release agent over `deployer`."""
    engine.gated = gated
    await engine.restart(agents=release_agents(deployer))


async def start_deploy(engine: EngineHarness, tool: str, release: str = "r-1") -> str:
    """A session of the release agent whose queued turn calls `tool` for `release`, then ends."""
    engine.script([call(tool, release=release), {"say": "done"}])
    return await engine.create_session(agent_id="release-agent")


async def crash_worker(engine: EngineHarness, deployer: Deployer, where: str = "after_effect") -> None:
    """Run the queued job until the worker dies `where` (after_effect, before_effect), lease gone."""
    crash = anyio.CancelScope()
    setattr(deployer, f"crash_{where}", crash.cancel)
    with crash:
        await engine.run_job(lease_s=-1)
    assert crash.cancelled_caught, "the worker never reached the tool"


async def entries(engine: EngineHarness) -> list[LedgerEntry]:
    """The tenant's entries, each result as the API shows it (a sealed one opened)."""
    rt = engine.runtime
    async with rt.db.read() as conn:
        found = (await list_entries(conn, "t1", status=None, after=None, order="asc", limit=100)).data
        return [dataclasses.replace(e, result=await shown_result(conn, rt.blobs, rt.sealer, e)) for e in found]


async def entry(engine: EngineHarness) -> LedgerEntry:
    found = await entries(engine)
    assert len(found) == 1, f"expected one ledger entry, found {found}"
    return found[0]
