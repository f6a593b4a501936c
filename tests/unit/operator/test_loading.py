"""Loading `--agents MODULE:ATTR`: every way it can go wrong is one clear line (and exit status 2
from `cairn serve` / `cairn worker`); a good module loads from the working directory."""

from __future__ import annotations

import secrets
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import cairn
from cairn import cli
from cairn.engine.tools.workspace import BUILTIN_TOOLS
from cairn.errors import AgentDefinitionError
from cairn.operator import LoadedAgents, load_agents

pytestmark = pytest.mark.anyio

GOOD = """
import cairn

@cairn.tool(side_effect=True)
def deploy_release(ctx: cairn.ToolContext, release: str) -> str:
    '''Deploy a release.'''
    return ctx.deps["prefix"] + release

registry = cairn.AgentRegistry(deps=lambda: {"prefix": "deployed:"})

@registry.agent("release-agent/v1")
def v1(deps: cairn.RuntimeDeps) -> cairn.Agent:
    return cairn.Agent(model="scripted:x", instructions="Ship " + deps["prefix"], tools=[deploy_release, "shell"])
"""


class Modules:
    """Writes modules with fresh names into a directory on `sys.path`, and forgets them after."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.names: list[str] = []

    def write(self, source: str) -> str:
        name = f"agents_{secrets.token_hex(4)}"
        (self.root / f"{name}.py").write_text(textwrap.dedent(source))
        self.names.append(name)
        return name


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Modules]:
    monkeypatch.syspath_prepend(str(tmp_path))
    made = Modules(tmp_path)
    yield made
    for name in made.names:
        sys.modules.pop(name, None)


def _load(spec: str) -> LoadedAgents:
    return load_agents(spec, BUILTIN_TOOLS)


def test_no_spec_loads_no_agents() -> None:
    agents = _load(None)  # type: ignore[arg-type]
    assert agents.all() == [] and agents.names() == [] and dict(agents.deps) == {}


def test_a_registry_loads_with_its_deps(modules: Modules) -> None:
    name = modules.write(GOOD)
    agents = _load(f"{name}:registry")
    loaded = agents.get("release-agent/v1")
    assert loaded is not None and loaded.agent.instructions == "Ship deployed:"
    assert agents.deps["prefix"] == "deployed:" and agents.source == f"{name}:registry"
    assert _load(f"{name}:registry").get("release-agent/v1").revision == loaded.revision  # type: ignore[union-attr]


def test_a_module_in_the_working_directory_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"cwd_agents_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(GOOD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert _load(f"{name}:registry").names() == ["release-agent"]
    finally:
        sys.modules.pop(name, None)


@pytest.mark.parametrize("spec", ["", "module", "module:", ":registry", "a:b:c", "my-agents:registry", "a b:c", "1mod:reg"])
def test_a_malformed_spec(spec: str) -> None:
    with pytest.raises(AgentDefinitionError, match="bad --agents value .*: write MODULE:ATTR, e.g. myagents:registry"):
        _load(spec)


def test_a_missing_module() -> None:
    with pytest.raises(AgentDefinitionError, match="no module named 'no_such_agents_module' \\(it must be importable from the working"):
        _load("no_such_agents_module:registry")
    with pytest.raises(AgentDefinitionError, match="no module named 'no_such_pkg.agents'"):
        _load("no_such_pkg.agents:registry")


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("import no_such_dependency_xyz\n", r"importing '\w+' failed: ModuleNotFoundError: No module named 'no_such_dependency_xyz'"),
        ("def broken(:\n", r"importing '\w+' failed: SyntaxError"),
        ("raise RuntimeError('no config')\n", r"importing '\w+' failed: RuntimeError: no config \(agents_\w+\.py:1 in <module>\)"),
        ("import cairn\n@cairn.tool\ndef t(x: set[int]) -> str:\n    'Doc.'\n", r"tool 't', parameter 'x': set\[int\] is not supported"),
    ],
)
def test_a_module_that_fails_to_import(modules: Modules, source: str, message: str) -> None:
    name = modules.write(source)
    with pytest.raises(AgentDefinitionError, match=message):
        _load(f"{name}:registry")


@pytest.mark.parametrize(
    ("source", "attr", "message"),
    [
        ("x = 1\n", "registry", r"module '\w+' has no attribute 'registry'"),
        ("import cairn\nregistry = cairn.AgentRegistry()\n", "registry.inner", r"has no attribute 'registry.inner'"),
        ("registry = {'release-agent/v1': None}\n", "registry", r"'registry' is a dict, not a cairn.AgentRegistry"),
        ("import cairn\nregistry = cairn.AgentRegistry()\n", "registry", "the registry has no agent versions"),
    ],
)
def test_an_attribute_that_is_missing_or_not_a_registry(modules: Modules, source: str, attr: str, message: str) -> None:
    name = modules.write(source)
    with pytest.raises(AgentDefinitionError, match=message):
        _load(f"{name}:{attr}")


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("raise KeyError('DEPLOY_TOKEN')", r"the factory of a/v1 failed: KeyError: 'DEPLOY_TOKEN' \(agents_\w+\.py:\d+ in v1\)"),
        ("return {'model': 'm'}", "the factory of a/v1 returned a dict, not a cairn.Agent"),
        ("return cairn.Agent(model='m', tools=['sh'])", r"a/v1: 'sh' is not a built-in tool"),
        ("return cairn.Agent(model='')", "the factory of a/v1 failed: cairn.Agent needs a model name"),
    ],
)
def test_a_factory_that_raises_or_returns_the_wrong_thing(modules: Modules, factory: str, message: str) -> None:
    name = modules.write(f"""
        import cairn
        registry = cairn.AgentRegistry()

        @registry.agent("a/v1")
        def v1(deps):
            {factory}
    """)
    with pytest.raises(AgentDefinitionError, match=message):
        _load(f"{name}:registry")


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        ("lambda: 1 / 0", "the deps provider failed: ZeroDivisionError: division by zero"),
        ("lambda: [1]", "the deps provider must return a mapping of names to objects, not list"),
    ],
)
def test_a_deps_provider_that_fails(modules: Modules, provider: str, message: str) -> None:
    name = modules.write(f"""
        import cairn
        registry = cairn.AgentRegistry(deps={provider})
        registry.add("a/v1", lambda deps: cairn.Agent(model="m"))
    """)
    with pytest.raises(AgentDefinitionError, match=message):
        _load(f"{name}:registry")


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_serve_and_worker_exit_2_with_one_line(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = cli.main([command, "--data-dir", str(tmp_path / "data"), "--agents", "no_such_agents_module:registry"])
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("cairn: error: --agents no_such_agents_module:registry: no module named 'no_such_agents_module'")
    assert not (tmp_path / "data").exists()  # refused before anything was made


# The public surface exactly as issue 15 writes it.
ISSUE_EXAMPLE = '''
import cairn

@cairn.tool(needs_approval=True, side_effect=True, approvers=["approver"])
async def deploy_release(ctx: cairn.ToolContext, release: str) -> str:
    """Deploy a release to production."""
    ...
    return f"deployed:{release}"

registry = cairn.AgentRegistry()

@registry.agent("release-agent/v1")
def release_agent_v1(deps: cairn.RuntimeDeps) -> cairn.Agent:
    return cairn.Agent(model="gpt-4.1", instructions="You ship releases.", tools=[deploy_release, "shell"])
'''


def test_the_issues_example_works_verbatim(modules: Modules) -> None:
    name = modules.write(ISSUE_EXAMPLE)
    loaded = _load(f"{name}:registry").get("release-agent/v1")
    assert loaded is not None and loaded.agent.model == "gpt-4.1" and loaded.builtin_tools == ("shell",)
    requirement = loaded.approval_for("deploy_release", {"release": "r-42"})
    assert requirement is not None and requirement.summary == "deploy_release(release='r-42')"
    assert requirement.approvers == frozenset({"approver"}) and loaded.is_side_effect("deploy_release")


async def test_the_example_module_loads_and_deploys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELEASES_LOG", str(tmp_path / "releases.log"))
    monkeypatch.setenv("RELEASE_AGENT_MODEL", "scripted:release")
    agents = _load("examples.release_agent:registry")
    v1, v2 = agents.versions("release-agent")
    assert (v1.version, v2.version) == ("release-agent/v1", "release-agent/v2") and v1.revision != v2.revision
    assert v2.agent.model == "scripted:release"
    assert v2.approval_for("shell", {"command": "git push origin main"}) is not None
    assert v2.approval_for("shell", {"command": "git status"}) is None
    tool = v2.operator_tool("deploy_release")
    assert tool is not None
    context = cairn.ToolContext(tenant="t", session_id="sess_1", turn_id="turn_1", call_id="call_1", deps=agents.deps)
    assert await tool.invoke(context, tool.parse({"release": "r-42"})) == "deployed:r-42"
    assert '"release": "r-42"' in (tmp_path / "releases.log").read_text()
