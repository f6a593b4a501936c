"""What part a tool plays for the local model, read from its parameters, never its name.

The prompt's rules, the reply format and the checks on saved files each need to know which
tool saves files (it takes a `path` and a `content`) and which runs commands (it takes a
`command`, or `cmd`); a client's tools may be named anything.
"""

from __future__ import annotations

from collections.abc import Sequence

from cairn.models.base import ToolSpec

__all__ = ["argument_names", "runner_name", "writes_files"]


def argument_names(tool: ToolSpec) -> set[str]:
    return set((tool.parameters.get("properties") or {}).keys())


def writes_files(tool: ToolSpec) -> bool:
    return {"path", "content"} <= argument_names(tool)


def runner_name(tools: Sequence[ToolSpec]) -> str | None:
    """The first tool that runs commands, if any."""
    return next((tool.name for tool in tools if {"command", "cmd"} & argument_names(tool)), None)
