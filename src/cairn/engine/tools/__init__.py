"""Tools and the pipeline every tool call goes through (validate -> gate -> reserve ->
execute -> record): the built-in workspace tools, client tools, and the stages' policies."""

from cairn.engine.tools.base import CommandResult, Hold, Tool, ToolArgumentError, ToolContext, ToolResult, arguments_json
from cairn.engine.tools.build import ToolPolicies, build_pipeline
from cairn.engine.tools.gate import AllowEveryCall, GatePolicy
from cairn.engine.tools.pipeline import PROCEED, CallInFlight, Finish, Pipeline, Stage, Verdict
from cairn.engine.tools.reserve import ReserveNothing, ReservePolicy
from cairn.engine.tools.toolbox import Toolbox, workspace_tools
from cairn.engine.tools.workspace import (
    MAX_READ_BYTES,
    WORKSPACE_TOOL_NAMES,
    parse_shell_arguments,
    run_file_tool,
    workspace_tool_specs,
)

__all__ = [
    "MAX_READ_BYTES",
    "PROCEED",
    "WORKSPACE_TOOL_NAMES",
    "AllowEveryCall",
    "CallInFlight",
    "CommandResult",
    "Finish",
    "GatePolicy",
    "Hold",
    "Pipeline",
    "ReserveNothing",
    "ReservePolicy",
    "Stage",
    "Tool",
    "ToolArgumentError",
    "ToolContext",
    "ToolPolicies",
    "ToolResult",
    "Toolbox",
    "Verdict",
    "arguments_json",
    "build_pipeline",
    "parse_shell_arguments",
    "run_file_tool",
    "workspace_tool_specs",
    "workspace_tools",
]
