"""The operator agents of the ledger's end-to-end tests, loaded with `--agents ledger_agents:registry`.

Every tool records each real execution outside Cairn: a line `<operation key> <target>`
appended to the file named by `CAIRN_TEST_DEPLOYS` (closed before the tool goes on, so a
SIGKILL right after keeps it), which the tests count from another process; the probes read it
back. Attempts, failed ones too, are appended to the same file with `.attempts` added.

Where a worker stops, deterministically (this process only, by its environment):
`CAIRN_TEST_PAUSE=before_executing` stops it after its ledger entry is reserved and before it
moves to executing (the ledger stage's `start_execution` is wrapped here);
`CAIRN_TEST_PAUSE=after_effect` stops it in the tool right after the effect is recorded. It
then writes the file `CAIRN_TEST_PAUSED` and waits until the file `CAIRN_TEST_GO` exists
(for ever, when the test kills it). `CAIRN_TEST_EFFECT_S` keeps every tool busy that long after
its effect (the window the random kills of the many-turn test aim at).

- `release-agent`: `deploy_release` (needs approval, has a probe) and `deploy_unprobed`
  (needs approval, no probe).
- `ops-agent`: the same effects without approval (`deploy_auto`, `deploy_auto_unprobed`);
  `flaky_deploy`, which raises `cairn.RetryableToolError` on its first `CAIRN_TEST_FLAKY`
  attempts; `broken_deploy`, which always raises another error; `deploy_note(release, note)`,
  whose operation key depends on the release only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

import cairn


def _effects() -> Path:
    return Path(os.environ["CAIRN_TEST_DEPLOYS"])


async def _pause(point: str) -> None:
    if os.environ.get("CAIRN_TEST_PAUSE") != point:
        return
    Path(os.environ["CAIRN_TEST_PAUSED"]).write_text(f"{os.getpid()} {point}\n")
    go = Path(os.environ["CAIRN_TEST_GO"])
    while not go.exists():
        await anyio.sleep(0.01)


if os.environ.get("CAIRN_TEST_PAUSE") == "before_executing":
    from cairn.engine.ledger import stage

    _start_execution = stage.start_execution

    async def _paused_start(*args: Any, **kwargs: Any) -> Any:
        await _pause("before_executing")
        return await _start_execution(*args, **kwargs)

    stage.start_execution = _paused_start  # type: ignore[assignment]


def _append(path: Path, line: str) -> None:
    with path.open("a") as log:
        log.write(line + "\n")


def _attempt(ctx: cairn.ToolContext, target: str) -> int:
    """Note an attempt; returns how many this operation has had, this one included."""
    path = _effects().with_suffix(".attempts")
    _append(path, f"{ctx.operation_key} {target}")
    return sum(1 for line in path.read_text().splitlines() if line.split()[0] == ctx.operation_key)


async def _deploy(ctx: cairn.ToolContext, release: str) -> str:
    _attempt(ctx, release)
    _append(_effects(), f"{ctx.operation_key} {release}")
    await _pause("after_effect")
    if os.environ.get("CAIRN_TEST_EFFECT_S"):
        await anyio.sleep(float(os.environ["CAIRN_TEST_EFFECT_S"]))
    return f"deployed:{release}"


def _find(ctx: cairn.ToolContext, arguments: Mapping[str, Any]) -> cairn.ProbeAnswer:
    """Look the effect up by its operation key, as one would ask the deploy system."""
    effects = _effects()
    lines = effects.read_text().splitlines() if effects.exists() else []
    if any(line.split()[0] == ctx.operation_key for line in lines):
        return cairn.ProbeAnswer.happened(f"deployed:{arguments['release']} (found by the probe)")
    return cairn.ProbeAnswer.did_not_happen()


def _release(arguments: Mapping[str, Any]) -> Any:
    return arguments["release"]


@cairn.tool(needs_approval=True, side_effect=True, approvers=["approver", "admin"], key=_release, probe=_find)
async def deploy_release(ctx: cairn.ToolContext, release: str) -> str:
    """Deploy a release to production."""
    return await _deploy(ctx, release)


@cairn.tool(needs_approval=True, side_effect=True, approvers=["approver", "admin"], key=_release)
async def deploy_unprobed(ctx: cairn.ToolContext, release: str) -> str:
    """Deploy a release to production; nothing can look up afterwards whether it happened."""
    return await _deploy(ctx, release)


@cairn.tool(side_effect=True, key=_release, probe=_find)
async def deploy_auto(ctx: cairn.ToolContext, release: str) -> str:
    """Deploy a release to staging."""
    return await _deploy(ctx, release)


@cairn.tool(side_effect=True, key=_release)
async def deploy_auto_unprobed(ctx: cairn.ToolContext, release: str) -> str:
    """Deploy a release to staging, with no way to look it up."""
    return await _deploy(ctx, release)


@cairn.tool(side_effect=True, key=_release)
async def flaky_deploy(ctx: cairn.ToolContext, release: str) -> str:
    """Deploy through an API that is busy at first."""
    if _attempt(ctx, release) <= int(os.environ.get("CAIRN_TEST_FLAKY", "0")):
        raise cairn.RetryableToolError("503 from the deploy API")
    _append(_effects(), f"{ctx.operation_key} {release}")
    return f"deployed:{release}"


@cairn.tool(side_effect=True, key=_release)
async def broken_deploy(ctx: cairn.ToolContext, release: str) -> str:
    """Deploy a release that cannot be deployed."""
    _attempt(ctx, release)
    raise ValueError(f"release {release} does not exist")


@cairn.tool(side_effect=True, key=_release)
async def deploy_note(ctx: cairn.ToolContext, release: str, note: str = "") -> str:
    """Deploy a release with a note for the changelog."""
    return await _deploy(ctx, release)


registry = cairn.AgentRegistry()


@registry.agent("release-agent/v1")
def release_agent(deps: cairn.RuntimeDeps) -> cairn.Agent:
    return cairn.Agent(model="scripted:ledger_deploy_release", instructions="You ship releases.",
                       tools=[deploy_release, deploy_unprobed])


@registry.agent("ops-agent/v1")
def ops_agent(deps: cairn.RuntimeDeps) -> cairn.Agent:
    return cairn.Agent(model="scripted:ledger_deploy_auto", instructions="You ship to staging.",
                       tools=[deploy_auto, deploy_auto_unprobed, flaky_deploy, broken_deploy, deploy_note])
