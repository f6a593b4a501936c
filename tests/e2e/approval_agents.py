"""The operator agents of the approval end-to-end tests, loaded with `--agents approval_agents:registry`.

`deploy_release` is a side-effecting tool that needs approval: it appends a line to the file
named by `CAIRN_TEST_DEPLOYS`, outside any sandbox, so a test counts its executions from
another process. `CAIRN_TEST_AGENT_VARIANT` lets a test start a worker whose registry has the
same version with another factory (`changed`) or no longer has it (`removed`).
"""

from __future__ import annotations

import os

import cairn

VARIANT = os.environ.get("CAIRN_TEST_AGENT_VARIANT", "v1")


@cairn.tool(needs_approval=True, side_effect=True, approvers=["approver", "admin"])
async def deploy_release(ctx: cairn.ToolContext, release: str) -> str:
    """Deploy a release to production."""
    approval = ctx.approval.id if ctx.approval is not None else "none"
    with open(os.environ["CAIRN_TEST_DEPLOYS"], "a") as deploys:
        deploys.write(f"{release} {approval}\n")
    return f"deployed:{release}"


registry = cairn.AgentRegistry()

if VARIANT != "removed":

    @registry.agent("release-agent/v1")
    def release_agent_v1(deps: cairn.RuntimeDeps) -> cairn.Agent:
        instructions = "You ship releases." if VARIANT == "v1" else "You ship releases, carefully."
        return cairn.Agent(model="scripted:approval_release", instructions=instructions, tools=[deploy_release])

else:

    @registry.agent("release-agent/v2")
    def release_agent_v2(deps: cairn.RuntimeDeps) -> cairn.Agent:
        return cairn.Agent(model="scripted:approval_release", instructions="You ship releases.", tools=[deploy_release])
