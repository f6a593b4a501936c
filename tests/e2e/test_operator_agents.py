"""Registered operator agents through the official client: `cairn serve --agents MODULE:ATTR`
lists them as saved agents, a session made with `agent_id` pins the newest version, and the
scripted model's call of the operator tool runs the operator's Python function in the worker
(its effect lands in a file outside the sandbox). With `serve --workers 0`, the turn runs on a
`cairn worker --agents` process; a worker without the agents fails the turn, saying why."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from cairn.testing.server import CairnServer, CairnWorker
from tests.e2e.conftest import make_server, remove_server
from tests.e2e.streams import TERMINAL, EventTail, read_turn

AGENTS = "e2e_release_agents"
MODULE = '''
import json
import os

import cairn


@cairn.tool(side_effect=True)
def deploy_release(ctx: cairn.ToolContext, release: str) -> str:
    """Deploy a release to production."""
    with open(ctx.deps["ledger"], "a") as ledger:
        ledger.write(json.dumps({"tenant": ctx.tenant, "session": ctx.session_id, "call": ctx.call_id, "release": release}) + "\\n")
    return f"deployed:{release}"


registry = cairn.AgentRegistry(deps=lambda: {"ledger": os.environ["CAIRN_E2E_LEDGER"]})


@registry.agent("release-agent/v1")
def release_agent_v1(deps: cairn.RuntimeDeps) -> cairn.Agent:
    return cairn.Agent(model="scripted:release", instructions="You ship releases.", tools=[deploy_release])


@registry.agent("audit-agent/2026-01")
def audit_agent(deps: cairn.RuntimeDeps) -> cairn.Agent:
    return cairn.Agent(model="scripted:release_plain", instructions="You read logs.", tools=["read_file"])


@registry.agent("release-agent/v2")
def release_agent_v2(deps: cairn.RuntimeDeps) -> cairn.Agent:
    return cairn.Agent(
        model="scripted:release_plain",
        instructions="You ship releases, carefully.",
        tools=[deploy_release, "shell"],
        approvals={"shell": cairn.commands_matching(r"^git push")},
    )
'''


class Operator:
    """Where the operator's module lives, and the ledger its tool writes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / f"{AGENTS}.py").write_text(textwrap.dedent(MODULE))
        self.ledger = root / "ledger.jsonl"
        self.env = {"PYTHONPATH": str(root), "CAIRN_E2E_LEDGER": str(self.ledger)}
        self.args = ("--agents", f"{AGENTS}:registry")

    def deployments(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.ledger.read_text().splitlines()] if self.ledger.exists() else []


@pytest.fixture(scope="module")
def operator(tmp_path_factory: pytest.TempPathFactory) -> Operator:
    return Operator(tmp_path_factory.mktemp("operator"))


@pytest.fixture(scope="module")
def agents_server(scripts_dir: Path, operator: Operator) -> Iterator[CairnServer]:
    instance = make_server(scripts_dir, env=operator.env, extra_args=operator.args).start()
    yield instance
    remove_server(instance)


def _versions(agent: Any) -> list[tuple[str, str]]:
    return [(v["version"], v["revision"]) for v in agent.model_extra["versions"]]


def test_registered_agents_are_saved_agents(agents_server: CairnServer) -> None:
    with agents_server.client() as client:
        assert [a.id for a in client.beta.agents.list(limit=1)] == ["release-agent", "audit-agent"]  # two pages
        first = client.beta.agents.list(limit=1, order="asc")
        assert [a.id for a in first.data] == ["audit-agent"] and first.has_more
        assert [a.id for a in client.beta.agents.list(order="asc", after="audit-agent")] == ["release-agent"]
        with pytest.raises(openai.BadRequestError, match="unknown agent id in `after`: nobody"):
            client.beta.agents.list(after="nobody")
        agent = client.beta.agents.retrieve("release-agent")
        assert agent.object == "agent" and agent.name == "release-agent"
        assert agent.model == "scripted:release_plain" and agent.instructions == "You ship releases, carefully."
        assert [t.name for t in agent.tools] == ["deploy_release"]  # type: ignore[union-attr]
        assert agent.tools[0].parameters["required"] == ["release"]  # type: ignore[union-attr]
        versions = _versions(agent)
        assert [v for v, _ in versions] == ["release-agent/v1", "release-agent/v2"]
        assert len({r for _, r in versions}) == 2 and all(len(r) == 64 for _, r in versions)
        assert agent.model_extra["version"] == "release-agent/v2" and agent.model_extra["revision"] == versions[1][1]
        shell = agent.model_extra["versions"][1]["builtin_tools"][0]
        assert shell["name"] == "shell" and shell["approval"]["needs_approval"] == {"predicate": {"matching": {"argument": "command", "patterns": ["^git push"]}}}
        with pytest.raises(openai.NotFoundError, match="No agent found with id 'ship-agent'"):
            client.beta.agents.retrieve("ship-agent")


def test_a_session_of_a_registered_agent_runs_its_operator_tool(agents_server: CairnServer, operator: Operator) -> None:
    with agents_server.client() as client:
        sessions = client.beta.agents.sessions
        # v2's own model only talks; the session's `agent` overrides it with one that deploys.
        stream = sessions.create(
            agent_id="release-agent", agent={"model": "scripted:release"}, environment={"type": "none"}, input="Ship r-42", stream=True
        )
        events = read_turn(stream)
        session_id = events[0].session.id  # type: ignore[union-attr]
        assert events[-2].type == "agent.session.turn.completed"
        deployed = [d for d in operator.deployments() if d["session"] == session_id]
        assert [(d["tenant"], d["release"]) for d in deployed] == [("default", "r-42")]

        session = sessions.retrieve(session_id)
        assert session.agent.id == "release-agent" and session.agent.name == "release-agent"
        assert session.agent.model == "scripted:release" and session.agent.instructions == "You ship releases, carefully."
        agent = client.beta.agents.retrieve("release-agent")
        assert (session.agent.model_extra["version"], session.agent.model_extra["revision"]) == _versions(agent)[1]

        items = list(sessions.items.list(session_id, order="asc"))
        call = next(i for i in items if i.type == "function_call")
        output = next(i for i in items if i.type == "function_call_output")
        assert call.name == "deploy_release" and json.loads(call.arguments) == {"release": "r-42"}  # type: ignore[arg-type]
        assert call.call_id == deployed[0]["call"]
        assert output.output == "deployed:r-42" and output.status == "completed"
        assert [i.content[0].text for i in items if i.type == "message" and i.role == "assistant"][-1] == "Deployed r-42."  # type: ignore[union-attr]
        assert [s.id for s in sessions.list(agent_id="release-agent")] == [session_id]


def test_an_unknown_agent_id_is_refused(agents_server: CairnServer) -> None:
    with agents_server.client() as client:
        with pytest.raises(openai.BadRequestError, match="unknown agent_id 'ship-agent'.*registered agents: audit-agent, release-agent") as refused:
            client.beta.agents.sessions.create(agent_id="ship-agent", environment={"type": "openai_hosted"})
        assert refused.value.param == "agent_id"
        with pytest.raises(openai.BadRequestError, match="`agent` with a `model` is required"):
            client.beta.agents.sessions.create(environment={"type": "openai_hosted"})


def test_the_worker_runs_the_tool_from_its_own_registry(scripts_dir: Path, operator: Operator) -> None:
    api = make_server(scripts_dir, env=operator.env, extra_args=("--workers", "0", *operator.args)).start()
    bare = CairnWorker(api.data_dir, name="bare-worker", scripts_dir=scripts_dir, env=operator.env, extra_args=("--workers", "1"))
    loaded = CairnWorker(api.data_dir, name="agents-worker", scripts_dir=scripts_dir, env=operator.env, extra_args=("--workers", "1", *operator.args))
    try:
        with api.client() as client:
            bare.start()
            missing = client.beta.agents.sessions.create(
                agent_id="release-agent", agent={"model": "scripted:release"}, environment={"type": "none"}, input="Ship it"
            )
            ended = EventTail(api, missing.id).until(lambda e: e["type"] in TERMINAL)
            assert ended["type"] == "agent.session.turn.failed"
            assert ended["turn"]["error"]["code"] == "executor_version_incompatible"
            assert "pinned to agent version release-agent/v2, which this worker does not have" in ended["turn"]["error"]["message"]
            bare.stop()

            loaded.start()
            session = client.beta.agents.sessions.create(
                agent_id="release-agent", agent={"model": "scripted:release"}, environment={"type": "none"}, input="Ship it"
            )
            ended = EventTail(api, session.id).until(lambda e: e["type"] in TERMINAL)
            assert ended["type"] == "agent.session.turn.completed", ended
            assert [d["release"] for d in operator.deployments() if d["session"] == session.id] == ["r-42"]  # the script's call
            assert not [d for d in operator.deployments() if d["session"] == missing.id]
    finally:
        bare.stop()
        loaded.stop()
        remove_server(api)
