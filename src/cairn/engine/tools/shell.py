"""The `shell` tool: one command in the session's sandbox, its output streamed as it comes.

Its call is recorded as a `command_execution` item, which carries the output, exit code
and duration itself (there is no separate output item). What is streamed is what is
stored: up to `MAX_ITEM_OUTPUT` characters, so one noisy command cannot fill the event log.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cairn.engine.tools.base import CommandResult, Tool, ToolContext, arguments_json
from cairn.engine.tools.workspace import ShellArguments, parse_shell_arguments, workspace_tool_spec
from cairn.errors import CairnError
from cairn.models.base import ToolCall
from cairn.sandbox.base import WORKSPACE_MOUNT, ExecRequest, SandboxBackend
from cairn.sandbox.egress import NetworkPolicy, SessionEgress, WireSecret
from cairn.store.sessions import SessionRecord

__all__ = ["MAX_ITEM_OUTPUT", "ShellTool"]

MAX_ITEM_OUTPUT = 1024 * 1024
_TRUNCATION_NOTICE = f"\n[output beyond {MAX_ITEM_OUTPUT} characters is neither streamed nor stored]\n"


class ShellTool(Tool):
    def __init__(self, sandbox: SandboxBackend, workspace_of: Callable[[str], Path], *, default_timeout_s: float) -> None:
        super().__init__(workspace_tool_spec("shell"))
        self._sandbox = sandbox
        self._workspace_of = workspace_of
        self._default_timeout_s = default_timeout_s

    def call_item(self, call: ToolCall) -> tuple[str, dict[str, Any]]:
        arguments = arguments_json(call.arguments)
        command = call.arguments.get("command")
        return "command_execution", {
            "command": command if isinstance(command, str) else arguments,
            "cwd": WORKSPACE_MOUNT,
            "output": "",
            "exit_code": None,
            "duration_ms": None,
            "arguments": arguments,
        }

    def parse(self, arguments: Mapping[str, Any]) -> ShellArguments:
        return parse_shell_arguments(arguments)

    async def execute(self, arguments: Any, ctx: ToolContext) -> CommandResult:
        assert isinstance(arguments, ShellArguments)
        session = ctx.session
        timeout_s = arguments.timeout_ms / 1000 if arguments.timeout_ms else self._default_timeout_s
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # What is streamed has the session's secret values taken out as it comes (a value may
        # arrive split between two chunks); the stored output is redacted whole when recorded.
        shown = ctx.known_values.redactor.stream()
        collected: list[str] = []
        size = 0

        def stream(text: str) -> None:
            if text:
                ctx.stream_output(text)

        async def on_output(chunk: bytes) -> None:
            nonlocal size
            text = decoder.decode(chunk)
            if not text:
                return
            kept = text[: max(0, MAX_ITEM_OUTPUT - size)]
            if kept:
                collected.append(kept)
                stream(shown.feed(kept))
            if size < MAX_ITEM_OUTPUT <= size + len(text):
                stream(shown.flush())
                ctx.stream_output(_TRUNCATION_NOTICE)
            size += len(text)

        request = ExecRequest(
            command=arguments.command,
            workspace=self._workspace_of(session.id),
            timeout_s=timeout_s,
            env=ctx.sandbox_env,
            egress=session_egress(session, ctx.wire_secrets),
        )
        try:
            result = await self._sandbox.exec(request, on_output)
        except CairnError as exc:
            stream(shown.flush())
            return CommandResult(error="".join(collected) + f"\n[sandbox error: {exc.message}]")
        tail = decoder.decode(b"", final=True)
        if tail:
            collected.append(tail)
        stream((shown.feed(tail) if size < MAX_ITEM_OUTPUT else "") + shown.flush())
        output = "".join(collected)
        if size > MAX_ITEM_OUTPUT:
            output += f"{_TRUNCATION_NOTICE}[{size} characters in all]"
        if result.timed_out:
            output += f"\n[timed out after {timeout_s:g} s]"
        return CommandResult(output=output, exit_code=result.exit_code, duration_ms=int(result.duration_s * 1000))


def session_egress(session: SessionRecord, secrets: Sequence[WireSecret] = ()) -> SessionEgress | None:
    """The session's network as the sandbox's egress proxy applies it, with the session's
    `environment_variable` credentials (`secrets`, loaded for this execution); None without
    network (then no credential goes anywhere)."""
    policy = NetworkPolicy.from_environment(session.environment.get("network"))
    return None if policy is None else SessionEgress(session.id, policy, tuple(secrets))
