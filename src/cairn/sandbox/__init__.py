"""Runs agent commands against session workspaces, isolated from the host (design invariant 8)."""

from cairn.sandbox.base import (
    WORKSPACE_MOUNT,
    ExecRequest,
    ExecResult,
    OutputSink,
    ResourceLimits,
    SandboxBackend,
)
from cairn.sandbox.selection import BACKEND_NAMES, select_backend

__all__ = [
    "BACKEND_NAMES",
    "ExecRequest",
    "ExecResult",
    "OutputSink",
    "ResourceLimits",
    "SandboxBackend",
    "WORKSPACE_MOUNT",
    "select_backend",
]
