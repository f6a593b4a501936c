"""`cairn.AgentRegistry`: the operator's agents, by version.

A version is `NAME/VERSION` (`release-agent/v1`); its factory builds a `cairn.Agent` from the
process's runtime dependencies. `cairn serve --agents MODULE:ATTR` and `cairn worker --agents
MODULE:ATTR` load a registry (`cairn.operator.loading`): the deps provider runs once per
process, then every factory, and each version gets its revision. Versions of one name are
ordered naturally (`v2` < `v10`); the newest is what a new session of that name pins.

    registry = cairn.AgentRegistry(deps=lambda: {"deployer": Deployer.from_env()})

    @registry.agent("release-agent/v1")
    def release_agent_v1(deps: cairn.RuntimeDeps) -> cairn.Agent:
        return cairn.Agent(model="gpt-4.1", instructions="You ship releases.", tools=[deploy_release, "shell"])
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from cairn.errors import AgentDefinitionError
from cairn.operator.agent import Agent
from cairn.operator.deps import RuntimeDeps

__all__ = ["AgentFactory", "AgentRegistry", "split_version", "version_order"]

AgentFactory = Callable[[RuntimeDeps], Agent]
DepsProvider = Callable[[], Mapping[str, Any]]

_NAME = r"[a-z0-9][a-z0-9_-]{0,63}"
_VERSION = re.compile(rf"^({_NAME})/([A-Za-z0-9][A-Za-z0-9._-]{{0,63}})$")


def split_version(version: str) -> tuple[str, str]:
    """`release-agent/v1` -> ("release-agent", "v1"); raises for anything else."""
    match = _VERSION.fullmatch(version) if isinstance(version, str) else None
    if match is None:
        raise AgentDefinitionError(
            f"bad agent version {version!r}: write NAME/VERSION, e.g. 'release-agent/v1' "
            "(NAME: lowercase letters, digits, '-' and '_'; VERSION: letters, digits, '.', '-' and '_')"
        )
    return match.group(1), match.group(2)


def version_order(version: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that orders `v2` before `v10` and `1.9` before `1.10`."""
    parts = re.findall(r"\d+|\D+", split_version(version)[1])
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts)


class AgentRegistry:
    def __init__(self, *, deps: DepsProvider | None = None) -> None:
        """`deps`: called once in each process that loads the registry; returns the runtime
        dependencies (name -> object) that factories and tools receive."""
        if deps is not None and not callable(deps):
            raise AgentDefinitionError("AgentRegistry(deps=...) takes a function that returns the runtime dependencies")
        self._deps = deps
        self._factories: dict[str, AgentFactory] = {}

    def agent(self, version: str) -> Callable[[AgentFactory], AgentFactory]:
        """Register the decorated factory as `version` (NAME/VERSION)."""

        def register(factory: AgentFactory) -> AgentFactory:
            self.add(version, factory)
            return factory

        return register

    def add(self, version: str, factory: AgentFactory) -> None:
        split_version(version)
        if version in self._factories:
            raise AgentDefinitionError(f"agent version {version!r} is registered twice")
        if not callable(factory):
            raise AgentDefinitionError(f"the factory of {version!r} must be a function of the runtime deps, not {factory!r}")
        self._factories[version] = factory

    @property
    def versions(self) -> list[str]:
        """Every registered version, by name, oldest version first."""
        return sorted(self._factories, key=lambda v: (split_version(v)[0], version_order(v)))

    def factory(self, version: str) -> AgentFactory:
        return self._factories[version]

    def make_deps(self) -> RuntimeDeps:
        """This process's runtime dependencies, from the provider (none without one)."""
        if self._deps is None:
            return RuntimeDeps()
        provided = self._deps()
        if not isinstance(provided, Mapping):
            raise AgentDefinitionError(f"the deps provider must return a mapping of names to objects, not {type(provided).__name__}")
        return RuntimeDeps(provided)
