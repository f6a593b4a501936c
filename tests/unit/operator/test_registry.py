"""The registry and what loading a version makes of it: versions and their order, `cairn.Agent`
checks, the revision (changes with tools, schemas, instructions and policy; stays otherwise),
the pinned-version check, and the approval policy as data (`approval_for`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

import cairn
from cairn.engine.tools.workspace import BUILTIN_TOOLS
from cairn.errors import AgentDefinitionError, AgentVersionError
from cairn.operator import DEFAULT_APPROVERS, LoadedAgent, LoadedAgents, RuntimeDeps


@cairn.tool(needs_approval=True, side_effect=True, approvers=["approver"], approval_ttl=600)
async def deploy_release(ctx: cairn.ToolContext, release: str, region: str = "eu") -> str:
    """Deploy a release to production."""
    return f"deployed:{release}"


@cairn.tool
def status(release: str) -> str:
    """The status of a release."""
    return "live"


def _loaded(agent: cairn.Agent, version: str = "release-agent/v1") -> LoadedAgent:
    return LoadedAgent(version, agent, BUILTIN_TOOLS)


def _revision(**fields: Any) -> str:
    base: dict[str, Any] = {"model": "gpt-4.1", "instructions": "You ship releases.", "tools": [deploy_release, "shell"]}
    return _loaded(cairn.Agent(**{**base, **fields})).revision


# -- the registry -----------------------------------------------------------------------


def test_versions_are_ordered_naturally_and_the_newest_is_pinned() -> None:
    registry = cairn.AgentRegistry()
    for version in ("release-agent/v10", "release-agent/v2", "other/1.9", "other/1.10"):
        registry.add(version, lambda deps: cairn.Agent(model="m"))
    assert registry.versions == ["other/1.9", "other/1.10", "release-agent/v2", "release-agent/v10"]
    agents = LoadedAgents([_loaded(registry.factory(v)(RuntimeDeps()), v) for v in registry.versions])
    assert agents.names() == ["other", "release-agent"]
    newest = agents.newest("release-agent")
    assert newest is not None and newest.version == "release-agent/v10"
    assert [a.version for a in agents.versions("release-agent")] == ["release-agent/v2", "release-agent/v10"]
    assert agents.newest("nobody") is None and agents.versions("nobody") == []


@pytest.mark.parametrize("version", ["release-agent", "Release/v1", "release agent/v1", "a/b/c", "/v1", "x/", "x/v 1", ""])
def test_bad_version_strings_are_refused(version: str) -> None:
    registry = cairn.AgentRegistry()
    with pytest.raises(AgentDefinitionError, match="bad agent version"):
        registry.agent(version)(lambda deps: cairn.Agent(model="m"))


def test_a_version_is_registered_once() -> None:
    registry = cairn.AgentRegistry()
    registry.add("a/v1", lambda deps: cairn.Agent(model="m"))
    with pytest.raises(AgentDefinitionError, match="registered twice"):
        registry.add("a/v1", lambda deps: cairn.Agent(model="m"))


def test_the_deps_provider_makes_read_only_runtime_deps_that_are_never_serialized() -> None:
    import copy
    import json
    import pickle

    deps = cairn.AgentRegistry(deps=lambda: {"region": "eu", "token": "s3cret"}).make_deps()
    assert deps["region"] == "eu" and deps.region == "eu" and dict(deps) == {"region": "eu", "token": "s3cret"}
    assert "s3cret" not in repr(deps)
    with pytest.raises(AttributeError, match="read-only"):
        deps.region = "us"
    with pytest.raises(KeyError, match="no runtime dependency 'db' \\(there are: region, token\\)"):
        deps["db"]
    with pytest.raises(TypeError, match="never serialized"):
        pickle.dumps(deps)
    with pytest.raises(TypeError, match="never serialized"):
        copy.deepcopy(deps)
    with pytest.raises(TypeError):
        json.dumps(deps)
    assert cairn.AgentRegistry().make_deps() == {}
    with pytest.raises(AgentDefinitionError, match="must return a mapping"):
        cairn.AgentRegistry(deps=lambda: ["region"]).make_deps()  # type: ignore[arg-type, return-value]


# -- cairn.Agent and LoadedAgent checks ---------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": ""}, "needs a model name"),
        ({"instructions": 5}, "instructions are text"),
        ({"tools": "shell"}, "tools are a list"),
        ({"tools": [print]}, "neither a @cairn.tool function nor a built-in tool name"),
        ({"tools": ["shell", "shell"]}, "'shell' is listed twice"),
        ({"tools": [status, status]}, "'status' is listed twice"),
        ({"tools": [status], "approvals": {"shell": True}}, "'shell' is not a built-in tool of this agent"),
        ({"tools": [status], "approvals": {"status": True}}, "'status' is not a built-in tool of this agent"),
        ({"tools": ["shell"], "approvals": {"shell": "sometimes"}}, "needs_approval must be True, False or a predicate"),
    ],
)
def test_bad_agents_are_refused_when_made(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(AgentDefinitionError, match=message):
        cairn.Agent(**{"model": "m", **fields})


def test_loading_checks_builtin_names_the_agent_name_and_clashes() -> None:
    with pytest.raises(AgentDefinitionError, match="'shel' is not a built-in tool \\(built-in tools: apply_patch, read_file, shell"):
        _loaded(cairn.Agent(model="m", tools=["shel"]))
    with pytest.raises(AgentDefinitionError, match="the agent is named 'other', but its version names 'release-agent'"):
        _loaded(cairn.Agent(model="m", name="other"))

    @cairn.tool
    def shell(command: str) -> str:
        """Not the built-in one."""
        return command

    with pytest.raises(AgentDefinitionError, match="tool name 'shell' is taken by a built-in tool"):
        _loaded(cairn.Agent(model="m", tools=[shell]))


# -- the revision -----------------------------------------------------------------------


def test_the_revision_stays_when_nothing_changes_and_ignores_the_model() -> None:
    assert _revision() == _revision()
    assert len(_revision()) == 64 and int(_revision(), 16) >= 0
    assert _revision(model="another-model") == _revision()


def _predicate_a(arguments: Mapping[str, Any]) -> bool:
    return bool(arguments.get("force"))


def _predicate_b(arguments: Mapping[str, Any]) -> bool:
    return not arguments.get("force")


def _variant(name: str, **options: Any) -> Callable[..., Any]:
    """A tool named `deploy_release` with other options, parameters or docstring."""
    namespace: dict[str, Any] = {"cairn": cairn}
    source = {
        "same": 'def deploy_release(ctx: cairn.ToolContext, release: str, region: str = "eu") -> str:\n    """Deploy a release to production."""',
        "new_parameter": 'def deploy_release(ctx: cairn.ToolContext, release: str, region: str = "eu", force: bool = False) -> str:\n    """Deploy a release to production."""',
        "new_type": 'def deploy_release(ctx: cairn.ToolContext, release: int, region: str = "eu") -> str:\n    """Deploy a release to production."""',
        "new_docstring": 'def deploy_release(ctx: cairn.ToolContext, release: str, region: str = "eu") -> str:\n    """Deploy a release to staging."""',
    }[name]
    exec(source + "\n    return ''", namespace)
    return cairn.tool(**options)(namespace["deploy_release"])


_SAME_OPTIONS = {"needs_approval": True, "side_effect": True, "approvers": ["approver"], "approval_ttl": 600}


@pytest.mark.parametrize(
    ("change", "changed"),
    [
        ({"tools": [_variant("same", **_SAME_OPTIONS), "shell"]}, False),
        ({"instructions": "You ship releases carefully."}, True),
        ({"instructions": None}, True),
        ({"tools": [deploy_release]}, True),
        ({"tools": [deploy_release, "shell", status]}, True),
        ({"tools": ["shell", deploy_release]}, False),  # the order the model sees them in is not part of it
        ({"tools": [_variant("new_parameter", **_SAME_OPTIONS), "shell"]}, True),
        ({"tools": [_variant("new_type", **_SAME_OPTIONS), "shell"]}, True),
        ({"tools": [_variant("new_docstring", **_SAME_OPTIONS), "shell"]}, True),
        ({"tools": [_variant("same", **{**_SAME_OPTIONS, "needs_approval": False}), "shell"]}, True),
        ({"tools": [_variant("same", **{**_SAME_OPTIONS, "needs_approval": _predicate_a}), "shell"]}, True),
        ({"tools": [_variant("same", **{**_SAME_OPTIONS, "approvers": ["admin"]}), "shell"]}, True),
        ({"tools": [_variant("same", **{**_SAME_OPTIONS, "approval_ttl": 60}), "shell"]}, True),
        ({"tools": [_variant("same", **{**_SAME_OPTIONS, "side_effect": False}), "shell"]}, True),
        ({"tools": [_variant("same", **{**_SAME_OPTIONS, "review": lambda a: {}}), "shell"]}, True),
        ({"approvals": {"shell": False}}, False),
        ({"approvals": {"shell": True}}, True),
        ({"approvals": {"shell": cairn.commands_matching(r"^git push")}}, True),
    ],
)
def test_the_revision_changes_with_tools_schemas_instructions_and_policy(change: dict[str, Any], changed: bool) -> None:
    assert (_revision(**change) != _revision()) is changed


def test_a_predicate_is_part_of_the_revision_by_its_code() -> None:
    one = _revision(tools=[_variant("same", **{**_SAME_OPTIONS, "needs_approval": _predicate_a}), "shell"])
    assert one == _revision(tools=[_variant("same", **{**_SAME_OPTIONS, "needs_approval": _predicate_a}), "shell"])
    assert one != _revision(tools=[_variant("same", **{**_SAME_OPTIONS, "needs_approval": _predicate_b}), "shell"])
    patterns = _revision(approvals={"shell": cairn.commands_matching(r"^git push")})
    assert patterns == _revision(approvals={"shell": cairn.commands_matching(r"^git push")})
    assert patterns != _revision(approvals={"shell": cairn.commands_matching(r"^git push", r"rm -rf")})


def test_a_session_is_pinned_to_its_version_and_revision() -> None:
    loaded = _loaded(cairn.Agent(model="m", instructions="one"))
    agents = LoadedAgents([loaded])
    assert agents.pinned("release-agent/v1", loaded.revision) is loaded
    with pytest.raises(AgentVersionError, match="pinned to agent version release-agent/v9, which this worker does not have") as missing:
        agents.pinned("release-agent/v9", loaded.revision)
    assert missing.value.reason == "missing" and missing.value.code == "executor_version_incompatible"
    with pytest.raises(AgentVersionError, match="changed since this session pinned it") as changed:
        agents.pinned("release-agent/v1", "0" * 64)
    assert changed.value.reason == "revision_changed"
    with pytest.raises(AgentVersionError, match="it was started without --agents"):
        LoadedAgents().pinned("release-agent/v1", None)


# -- approval_for -----------------------------------------------------------------------


def test_an_operator_tool_that_always_needs_approval() -> None:
    agent = _loaded(cairn.Agent(model="m", tools=[deploy_release, status]))
    requirement = agent.approval_for("deploy_release", {"release": "r-42"})
    assert requirement is not None
    assert requirement.approvers == frozenset({"approver"}) and requirement.ttl_s == 600.0
    assert requirement.review == {"release": "r-42", "region": "eu"}
    assert requirement.summary == "deploy_release(release='r-42', region='eu')"
    assert agent.approval_for("status", {"release": "r-42"}) is None
    assert agent.approval_for("no_such_tool", {}) is None
    assert agent.is_side_effect("deploy_release") and not agent.is_side_effect("status") and not agent.is_side_effect("shell")
    assert agent.operator_tool("deploy_release") is deploy_release and agent.operator_tool("shell") is None


def test_a_predicate_sees_the_parsed_arguments() -> None:
    seen: list[Mapping[str, Any]] = []

    def big(arguments: Mapping[str, Any]) -> bool:
        seen.append(arguments)
        return bool(arguments["amount"] > 100)

    @cairn.tool(needs_approval=big)
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return "refunded"

    agent = _loaded(cairn.Agent(model="m", tools=[refund]))
    assert agent.approval_for("refund", {"order": "o-1", "amount": 20}) is None
    requirement = agent.approval_for("refund", {"order": "o-1", "amount": "500"})
    assert requirement is not None and requirement.approvers == DEFAULT_APPROVERS and requirement.ttl_s is None
    assert seen == [{"order": "o-1", "amount": 20}, {"order": "o-1", "amount": 500}]


def test_failing_predicates_and_invalid_arguments_fail_closed() -> None:
    def broken(arguments: Mapping[str, Any]) -> bool:
        raise RuntimeError("boom")

    @cairn.tool(needs_approval=broken)
    def refund(order: str, secret: str = "") -> str:
        """Refund an order."""
        return "refunded"

    agent = _loaded(cairn.Agent(model="m", tools=[refund, status]))
    assert agent.approval_for("refund", {"order": "o-1"}) is not None
    invalid = agent.approval_for("refund", {"order": 5, "secret": "hunter2"})
    assert invalid is not None and invalid.review == {} and "hunter2" not in invalid.summary
    # A tool that never needs approval stays so, whatever its arguments.
    assert agent.approval_for("status", {"release": 5}) is None


def test_the_review_redacts_what_the_approver_sees() -> None:
    @cairn.tool(needs_approval=True, review=lambda a: {"card": "****" + a["card"][-4:], "amount": a["amount"]})
    def charge(card: str, amount: int) -> str:
        """Charge a card."""
        return "charged"

    @cairn.tool(needs_approval=True, review=lambda a: 1 / 0)  # type: ignore[arg-type, return-value]
    def broken(card: str) -> str:
        """Charge a card."""
        return "charged"

    @cairn.tool(needs_approval=True, review=lambda a: ["not", "a", "mapping"])  # type: ignore[arg-type, return-value]
    def listing(card: str) -> str:
        """Charge a card."""
        return "charged"

    agent = _loaded(cairn.Agent(model="m", tools=[charge, broken, listing]))
    requirement = agent.approval_for("charge", {"card": "4242424242424242", "amount": 5})
    assert requirement is not None and requirement.review == {"card": "****4242", "amount": 5}
    assert "4242424242424242" not in requirement.summary
    for name in ("broken", "listing"):
        failed = agent.approval_for(name, {"card": "4242424242424242"})
        assert failed is not None and "4242424242424242" not in str(failed.review) and "review_failed" in failed.review


def test_builtin_tools_take_a_policy_per_agent() -> None:
    agent = _loaded(
        cairn.Agent(
            model="m",
            tools=["shell", "write_file", "read_file", "apply_patch"],
            approvals={
                "shell": cairn.commands_matching(r"^git push", r"\brm -rf\b"),
                "write_file": cairn.ApprovalPolicy(needs_approval=True, approvers=frozenset({"admin"}), ttl_s=60),
                "apply_patch": False,
            },
        )
    )
    assert agent.approval_for("shell", {"command": "ls -la"}) is None
    push = agent.approval_for("shell", {"command": "git push origin main"})
    assert push is not None and push.review == {"command": "git push origin main", "timeout_ms": None}
    assert push.summary == "shell(command='git push origin main', timeout_ms=None)"
    assert agent.approval_for("shell", {"command": "cd build && rm -rf out"}) is not None
    write = agent.approval_for("write_file", {"path": "a.txt", "content": "x"})
    assert write is not None and write.approvers == frozenset({"admin"}) and write.ttl_s == 60
    assert agent.approval_for("apply_patch", {"patch": "x"}) is None
    assert agent.approval_for("read_file", {"path": "a.txt"}) is None
    assert agent.may_need_approval("shell") and not agent.may_need_approval("read_file")
    # A shell call the policy cannot read (no command) needs approval: fail closed.
    assert agent.approval_for("shell", {"cmd": "git push"}) is not None


def test_matching_checks_its_patterns() -> None:
    with pytest.raises(AgentDefinitionError, match="bad pattern"):
        cairn.commands_matching("(")
    with pytest.raises(AgentDefinitionError, match="at least one pattern"):
        cairn.matching("path")
    assert cairn.matching("path", r"^/etc")({"path": "/etc/passwd"})
    assert not cairn.matching("path", r"^/etc")({"path": 5})


def test_the_api_view_of_a_version() -> None:
    agent = _loaded(cairn.Agent(model="gpt-4.1", instructions="Ship.", tools=[deploy_release, "shell"], approvals={"shell": True}))
    described = agent.describe()
    assert described["version"] == "release-agent/v1" and described["revision"] == agent.revision
    assert described["tools"][0]["name"] == "deploy_release"
    assert described["tools"][0]["approval"] == {"needs_approval": True, "approvers": ["approver"], "ttl_s": 600.0, "review": None}
    assert described["builtin_tools"] == [
        {"name": "shell", "approval": {"needs_approval": True, "approvers": ["admin", "approver"], "ttl_s": None, "review": None}}
    ]
    assert agent.function_tools() == [
        {"type": "function", "name": "deploy_release", "description": "Deploy a release to production.",
         "parameters": deploy_release.parameters, "defer_loading": False}
    ]


def test_an_approval_policy_made_directly_is_checked_too() -> None:
    policy = cairn.ApprovalPolicy(needs_approval=True, approvers=["approver"], ttl_s=30)  # type: ignore[arg-type]
    assert policy.approvers == frozenset({"approver"}) and policy.ttl_s == 30.0
    with pytest.raises(AgentDefinitionError, match="cairn.ApprovalPolicy: needs_approval must be True, False or a predicate"):
        cairn.ApprovalPolicy(needs_approval="always")  # type: ignore[arg-type]
    with pytest.raises(AgentDefinitionError, match="cairn.ApprovalPolicy: approval_ttl must be a positive number"):
        cairn.ApprovalPolicy(needs_approval=True, ttl_s=0)
