"""Loading `--agents MODULE:ATTR`: import the operator's module, find its registry, build every
version with this process's runtime dependencies.

The module is imported from the working directory or `PYTHONPATH`, like `python -m` would.
Anything that goes wrong is an `AgentDefinitionError` with one line that says what and where
(`cairn serve` and `cairn worker` print it and exit with status 2): a malformed spec, a module
that is missing or fails to import, an attribute that is missing or not an `AgentRegistry`, an
empty registry, a deps provider or a factory that raises or returns the wrong thing.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import traceback
from typing import Any

from cairn.errors import AgentDefinitionError
from cairn.operator.agent import Agent
from cairn.operator.deps import RuntimeDeps
from cairn.operator.loaded import BuiltinTools, LoadedAgent, LoadedAgents
from cairn.operator.registry import AgentRegistry

__all__ = ["load_agents", "load_registry"]

log = logging.getLogger(__name__)

_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_SPEC = re.compile(rf"^({_DOTTED}):({_DOTTED})$")


def load_agents(spec: str | None, builtins: BuiltinTools) -> LoadedAgents:
    """The agents `spec` (MODULE:ATTR) names, built for this process; none for None."""
    if spec is None:
        return LoadedAgents()
    registry = load_registry(spec)
    try:
        deps = registry.make_deps()
    except AgentDefinitionError as exc:
        raise AgentDefinitionError(f"{spec}: {exc.message}") from exc
    except Exception as exc:
        raise AgentDefinitionError(f"{spec}: the deps provider failed: {_where(exc)}") from exc
    loaded = [_build(registry, version, deps, builtins) for version in registry.versions]
    agents = LoadedAgents(loaded, deps, source=spec)
    log.info("agents from %s: %s", spec, ", ".join(f"{a.version} ({a.revision[:12]})" for a in agents.all()))
    return agents


def load_registry(spec: str) -> AgentRegistry:
    """Import the module of `spec` and return the registry it names."""
    match = _SPEC.fullmatch(spec) if isinstance(spec, str) else None
    if match is None:
        raise AgentDefinitionError(f"bad --agents value {spec!r}: write MODULE:ATTR, e.g. myagents:registry")
    module_name, attr = match.groups()
    _importable_from_working_directory()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise AgentDefinitionError(
                f"--agents {spec}: no module named {module_name!r} (it must be importable from the working directory "
                f"{os.getcwd()} or PYTHONPATH)"
            ) from exc
        raise AgentDefinitionError(f"--agents {spec}: importing {module_name!r} failed: {_where(exc)}") from exc
    except AgentDefinitionError as exc:
        raise AgentDefinitionError(f"--agents {spec}: {exc.message}") from exc
    except Exception as exc:
        raise AgentDefinitionError(f"--agents {spec}: importing {module_name!r} failed: {_where(exc)}") from exc
    found: Any = module
    for part in attr.split("."):
        if not hasattr(found, part):
            raise AgentDefinitionError(f"--agents {spec}: module {module_name!r} has no attribute {attr!r}")
        found = getattr(found, part)
    if not isinstance(found, AgentRegistry):
        raise AgentDefinitionError(f"--agents {spec}: {attr!r} is a {type(found).__name__}, not a cairn.AgentRegistry")
    if not found.versions:
        raise AgentDefinitionError(f"--agents {spec}: the registry has no agent versions (register one with @registry.agent)")
    return found


def _build(registry: AgentRegistry, version: str, deps: RuntimeDeps, builtins: BuiltinTools) -> LoadedAgent:
    try:
        agent = registry.factory(version)(deps)
    except AgentDefinitionError as exc:
        raise AgentDefinitionError(f"the factory of {version} failed: {exc.message}") from exc
    except Exception as exc:
        raise AgentDefinitionError(f"the factory of {version} failed: {_where(exc)}") from exc
    if not isinstance(agent, Agent):
        raise AgentDefinitionError(f"the factory of {version} returned a {type(agent).__name__}, not a cairn.Agent")
    return LoadedAgent(version, agent, builtins)


def _importable_from_working_directory() -> None:
    """`cairn` started as a console script has its own directory first on `sys.path`, not the
    working directory that `python -m` would put there."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)


def _where(exc: BaseException) -> str:
    """`ExcType: message (file.py:12 in function)` of the innermost frame that raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    location = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {exc}{location}"
