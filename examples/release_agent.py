"""A release agent in two versions, with a `deploy_release` tool that waits for an approver.

From the repository root:

    cairn serve --agents examples.release_agent:registry

then, with the official client (`cairn.Client` or `openai.OpenAI(base_url=..., api_key=...)`):

    session = client.beta.agents.sessions.create(
        agent_id="release-agent",                      # the newest version: release-agent/v2, pinned
        environment={"type": "openai_hosted"},
        input="Ship r-42",
    )

The model is `gpt-4.1` (an OpenAI-compatible endpoint: OPENAI_API_KEY, OPENAI_BASE_URL), or
whatever RELEASE_AGENT_MODEL names; a session may override it (`agent={"model": ...}`).
Deployments are appended to RELEASES_LOG (default `releases.log` in the working directory):
stand-ins for your deploy system's client, built once per process as a runtime dependency.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import cairn


class Releases:
    """The deploy system, as the tools see it (here: a log of what was deployed)."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def deploy(self, release: str, *, session_id: str, approved_by: str | None) -> str:
        entry = {"release": release, "session": session_id, "approved_by": approved_by, "at": time.time()}
        with self.log.open("a") as log:
            log.write(json.dumps(entry) + "\n")
        return f"deployed:{release}"


@cairn.tool(needs_approval=True, side_effect=True, approvers=["approver"], approval_ttl=timedelta(hours=4))
def deploy_release(ctx: cairn.ToolContext, release: str) -> str:
    """Deploy a release to production."""
    releases: Releases = ctx.deps["releases"]
    approver = ctx.approval.decided_by_key if ctx.approval is not None else None
    return releases.deploy(release, session_id=ctx.session_id, approved_by=approver)


registry = cairn.AgentRegistry(
    deps=lambda: {
        "releases": Releases(Path(os.environ.get("RELEASES_LOG", "releases.log"))),
        "model": os.environ.get("RELEASE_AGENT_MODEL", "gpt-4.1"),
    }
)


@registry.agent("release-agent/v1")
def release_agent_v1(deps: cairn.RuntimeDeps) -> cairn.Agent:
    return cairn.Agent(model=deps["model"], instructions="You ship releases.", tools=[deploy_release, "shell"])


@registry.agent("release-agent/v2")
def release_agent_v2(deps: cairn.RuntimeDeps) -> cairn.Agent:
    return cairn.Agent(
        model=deps["model"],
        instructions="You ship releases. Read the release notes in the workspace before you deploy.",
        tools=[deploy_release, "shell", "read_file"],
        # A push or a recursive delete waits for a person too; other commands run at once.
        approvals={"shell": cairn.commands_matching(r"^\s*git push", r"\brm -rf\b")},
    )
