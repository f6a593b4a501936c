"""The built-in file tools and the schemas of every built-in workspace tool.

`read_file`, `write_file` and `apply_patch` work on the workspace from the host through
`WorkspaceFiles`, which refuses any path outside `/workspace`; `shell` runs in the sandbox
(`cairn.engine.tools.shell`). A bad argument or a refused path is a tool error the model
sees, never a turn failure.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cairn._concurrency import run_sync
from cairn._validation import validation_problems
from cairn.engine.tools.base import Tool, ToolArgumentError, ToolContext, ToolResult
from cairn.engine.tools.patch import apply_hunks, parse_patch
from cairn.engine.workspace_files import WorkspaceFiles, workspace_relative
from cairn.errors import InvalidRequestError
from cairn.models.base import ToolSpec
from cairn.operator import BuiltinTools

__all__ = [
    "BUILTIN_TOOLS",
    "MAX_READ_BYTES",
    "FileTool",
    "ShellArguments",
    "WORKSPACE_TOOL_NAMES",
    "file_tools",
    "parse_shell_arguments",
    "parse_workspace_arguments",
    "run_file_tool",
    "workspace_tool_spec",
    "workspace_tool_specs",
]

MAX_READ_BYTES = 256 * 1024
_INLINE_WRITE_BYTES = 256 * 1024
MAX_TIMEOUT_MS = 3_600_000


class _Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ShellArguments(_Args):
    command: str = Field(min_length=1)
    timeout_ms: int | None = Field(default=None, gt=0, le=MAX_TIMEOUT_MS)


class _WriteFile(_Args):
    path: str = Field(min_length=1)
    content: str


class _ReadFile(_Args):
    path: str = Field(min_length=1)


class _ApplyPatch(_Args):
    patch: str = Field(min_length=1)


_SCHEMAS: dict[str, tuple[type[_Args], str]] = {
    "shell": (
        ShellArguments,
        "Run a shell command (/bin/sh -c) in the workspace; the working directory is /workspace. "
        "Returns the exit code and combined output.",
    ),
    "write_file": (
        _WriteFile,
        "Create or overwrite a text file in /workspace with the given content. It only saves text and runs "
        "nothing: run commands (mkdir, cp, python3 …) with the shell tool.",
    ),
    "read_file": (_ReadFile, "Read a text file from /workspace."),
    "apply_patch": (
        _ApplyPatch,
        "Edit files with a patch: '*** Begin Patch', then '*** Add File: P' (+lines), "
        "'*** Update File: P' (@@ hunks of ' '/'-'/'+' lines) or '*** Delete File: P', then '*** End Patch'.",
    ),
}

WORKSPACE_TOOL_NAMES = frozenset(_SCHEMAS)


@functools.cache
def _schema(model: type[_Args]) -> dict[str, Any]:
    """Generated once: pydantic takes milliseconds per schema, and every turn needs them."""
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


def workspace_tool_spec(name: str) -> ToolSpec:
    """The spec of one built-in tool, with its own copy of the schema (a turn may keep it)."""
    model, description = _SCHEMAS[name]
    return ToolSpec(name=name, description=description, parameters=copy.deepcopy(_schema(model)), kind="workspace")


def workspace_tool_specs() -> list[ToolSpec]:
    return [workspace_tool_spec(name) for name in _SCHEMAS]


def parse_workspace_arguments(name: str, arguments: Mapping[str, Any]) -> _Args:
    """Validate a built-in tool's arguments; raises `ToolArgumentError` naming every problem."""
    model = _SCHEMAS[name][0]
    try:
        return model.model_validate(dict(arguments))
    except ValidationError as exc:
        raise ToolArgumentError(f"invalid arguments for {name}: {validation_problems(exc)}") from exc


# What an operator agent's approval policies see of the built-in tools.
BUILTIN_TOOLS = BuiltinTools(WORKSPACE_TOOL_NAMES, parse_workspace_arguments)


def parse_shell_arguments(arguments: Mapping[str, Any]) -> ShellArguments:
    parsed = parse_workspace_arguments("shell", arguments)
    assert isinstance(parsed, ShellArguments)
    return parsed


async def run_file_tool(name: str, arguments: Mapping[str, Any], files: WorkspaceFiles) -> str:
    """Run a file tool and return its output text; raises `InvalidRequestError` for tool errors."""
    return await _run_parsed(parse_workspace_arguments(name, arguments), files)


async def _run_parsed(parsed: _Args, files: WorkspaceFiles) -> str:
    """Reads (at most `MAX_READ_BYTES`) and writes of up to `_INLINE_WRITE_BYTES` run on the event
    loop: on a local disk they take microseconds, a thread hop takes longer than the work
    (the same trade as SQLite's, `cairn.store.db`). Patches can touch large files and go to
    a worker thread.
    """
    if isinstance(parsed, _ReadFile):
        data = files.read_bytes(parsed.path, max_bytes=MAX_READ_BYTES)
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise InvalidRequestError(f"{parsed.path} is not UTF-8 text", param="path") from None
    if isinstance(parsed, _WriteFile):
        data = parsed.content.encode()
        if len(data) <= _INLINE_WRITE_BYTES:
            files.write_bytes(parsed.path, data)
        else:
            await run_sync(files.write_bytes, parsed.path, data)
        return f"wrote {len(data)} bytes to /workspace/{workspace_relative(parsed.path)}"
    assert isinstance(parsed, _ApplyPatch)
    return await run_sync(_apply_patch, parsed.patch, files)


class FileTool(Tool):
    """`read_file`, `write_file` or `apply_patch` on the session's workspace."""

    def __init__(self, name: str, files_of: Callable[[str], WorkspaceFiles]) -> None:
        super().__init__(workspace_tool_spec(name))
        self._files_of = files_of
        self.is_read_only = name == "read_file"

    def parse(self, arguments: Mapping[str, Any]) -> Any:
        return parse_workspace_arguments(self.name, arguments)

    async def execute(self, arguments: Any, ctx: ToolContext) -> ToolResult:
        try:
            return ToolResult(output=await _run_parsed(arguments, self._files_of(ctx.session.id)))
        except InvalidRequestError as exc:
            return ToolResult(error=exc.message)


def file_tools(files_of: Callable[[str], WorkspaceFiles]) -> list[FileTool]:
    """The file tools, reading and writing the workspace `files_of(session_id)` returns."""
    return [FileTool(name, files_of) for name in _SCHEMAS if name != "shell"]


def _apply_patch(patch: str, files: WorkspaceFiles) -> str:
    changes = parse_patch(patch)
    # Compute every new content first, so a failing hunk leaves all files untouched.
    writes: list[tuple[str, bytes]] = []
    deletes: list[str] = []
    summary: list[str] = []
    for change in changes:
        if change.kind == "add":
            writes.append((change.path, ("\n".join(change.content) + "\n").encode()))
            summary.append(f"A {change.path}")
        elif change.kind == "delete":
            files.read_bytes(change.path, max_bytes=64 * 1024 * 1024)
            deletes.append(change.path)
            summary.append(f"D {change.path}")
        else:
            original = files.read_bytes(change.path, max_bytes=64 * 1024 * 1024).decode()
            updated = apply_hunks(original, change.hunks, change.path) if change.hunks else original
            target = change.move_to or change.path
            writes.append((target, updated.encode()))
            if change.move_to:
                deletes.append(change.path)
                summary.append(f"R {change.path} -> {change.move_to}")
            else:
                summary.append(f"M {change.path}")
    for path, data in writes:
        files.write_bytes(path, data)
    for path in deletes:
        files.delete(path)
    return "\n".join(["applied patch:"] + summary)
