"""The tools of a turn: built-in ones only with a workspace, client tools, and unknown names."""

from __future__ import annotations

import pytest

from cairn.engine.loop.step import session_toolbox
from cairn.engine.tools import ToolArgumentError
from cairn.engine.tools.toolbox import UnknownTool
from tests.unit.engine.harness import EngineHarness

pytestmark = pytest.mark.anyio

_TOOL = {"type": "function", "name": "lookup", "description": "Look it up", "parameters": {"type": "object", "properties": {}}}


async def test_a_session_with_a_workspace_gets_the_builtin_tools_then_its_client_tools(engine: EngineHarness) -> None:
    engine.script([{"say": "unused"}])
    session = await engine.session(await engine.create_session(tools=[_TOOL]))
    toolbox = session_toolbox(engine.runtime, session)
    assert [(s.name, s.kind) for s in toolbox.specs] == [
        ("shell", "workspace"), ("write_file", "workspace"), ("read_file", "workspace"), ("apply_patch", "workspace"),
        ("lookup", "client"),
    ]
    assert toolbox.get("read_file").is_read_only and not toolbox.get("lookup").is_read_only


async def test_a_session_without_a_workspace_has_only_its_client_tools(engine: EngineHarness) -> None:
    engine.script([{"say": "unused"}])
    session = await engine.session(await engine.create_session(tools=[_TOOL], workspace=False))
    toolbox = session_toolbox(engine.runtime, session)
    assert [s.name for s in toolbox.specs] == ["lookup"]
    shell = toolbox.get("shell")
    assert isinstance(shell, UnknownTool)
    with pytest.raises(ToolArgumentError, match="unknown tool 'shell'; available tools: lookup"):
        shell.parse({"command": "ls"})
