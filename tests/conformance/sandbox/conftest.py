"""Fixtures shared by the sandbox conformance suite: every backend, real processes, real bwrap.

Each backend is forced by name, so the fallbacks (namespaces, landlock) run the same suite
on a host where bwrap works, and so does bwrap's container-per-command form
(`bwrap-per-command`) where bwrap's default is a container per session; a backend that
cannot work on this host is skipped with its reason. A case a backend cannot pass by design is skipped by a declared capability
(`requires_capability`), never by backend name.

Workspaces live under a 0711 directory in /tmp rather than pytest's tmp_path: bwrap runs as
the unprivileged sandbox account, which cannot traverse /tmp/pytest-of-root (0700)
(`cairn.sandbox.testing.workspace_root`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from cairn.errors import SandboxError
from cairn.sandbox import (
    BACKEND_NAMES,
    ExecRequest,
    ExecResult,
    ResourceLimits,
    SandboxBackend,
    select_backend,
    testing,
)
from cairn.sandbox.bwrap_sessions import detect_bwrap
from cairn.sandbox.egress import NetworkPolicy, SessionEgress

# bwrap's fallback form, forced: a fresh container for each command.
PER_COMMAND_BWRAP = "bwrap-per-command"
BACKENDS = (*(name for name in BACKEND_NAMES if name != "auto"), PER_COMMAND_BWRAP)


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"debug": True})


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> SandboxBackend:
    try:
        if request.param == PER_COMMAND_BWRAP:
            return detect_bwrap(session_containers=False)
        return select_backend(request.param)
    except SandboxError as exc:
        pytest.skip(f"backend {request.param!r} does not work on this host: {exc.message}")


def requires_capability(backend: SandboxBackend, capability: str, why: str) -> None:
    """Skip the calling test unless `backend` declares `capability`."""
    if capability not in backend.capabilities:
        pytest.skip(f"backend {backend.name!r} lacks the {capability!r} capability: {why}")


@pytest.fixture(scope="session")
def workspace_root() -> Iterator[Path]:
    with testing.workspace_root("cairn-sandbox-tests-") as root:
        yield root


@pytest.fixture
def new_workspace(
    workspace_root: Path, backend: SandboxBackend
) -> Callable[[], Awaitable[Path]]:
    """Create and prepare a fresh workspace for `backend`."""
    return partial(testing.new_workspace, workspace_root, backend)


class Recorder:
    """Collects a command's streamed output."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    async def __call__(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")


Run = Callable[..., Awaitable[tuple[ExecResult, str]]]


@pytest.fixture
def run(backend: SandboxBackend) -> Run:
    """Run a command in a workspace; returns the result and the combined output."""

    async def run_command(
        command: str,
        workspace: Path,
        *,
        timeout_s: float = 20.0,
        limits: ResourceLimits | None = None,
        network: bool = False,
        env: dict[str, str] | None = None,
    ) -> tuple[ExecResult, str]:
        recorder = Recorder()
        request = ExecRequest(
            command=command,
            workspace=workspace,
            timeout_s=timeout_s,
            env=env or {},
            limits=limits or ResourceLimits(),
            egress=SessionEgress("sess_conformance", NetworkPolicy("enabled")) if network else None,
        )
        result = await backend.exec(request, recorder)
        return result, recorder.text

    return run_command
