"""The launcher's waiter leash: a namespaced command dies with the waiter outside it, even
when it left its process group and no cgroup tracks it (the server kills through the
waiter). The privilege drop clears a parent-death signal, so the leash is armed after it."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest

from cairn.errors import SandboxError
from cairn.sandbox import ExecRequest, ResourceLimits, testing
from cairn.sandbox._containment import CommandContainment
from cairn.sandbox._workspace import workspace_identity
from cairn.sandbox.namespaces import NamespacesBackend
from cairn.sandbox.testing import host_processes_with
from tests.waits import until

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"debug": True})


async def test_a_namespaced_command_dies_with_its_waiter() -> None:
    try:
        backend = NamespacesBackend.detect()
    except SandboxError as exc:
        pytest.skip(f"the namespaces backend does not work here: {exc.message}")
    marker = f"cairn-leash-{uuid.uuid4().hex}"
    with testing.workspace_root("cairn-leash-") as root:
        workspace = await testing.new_workspace(root, backend)
        request = ExecRequest(
            command=f"exec setsid sh -c 'sleep 600; : {marker}'", workspace=workspace,
            timeout_s=30, limits=ResourceLimits(memory_bytes=None, max_processes=None),
        )
        untracked = CommandContainment(  # no cgroup: only the leash can end it
            cgroup=None, rlimits=backend._containment.rlimit_plan(request.limits),
            workspace=workspace_identity(Path(workspace)),
        )
        command = backend._forks.start(backend._spec(request, untracked, None))
        try:
            await command.started()
            await until(lambda: host_processes_with(marker), "the command to start")
            os.kill(command.pid, signal.SIGKILL)  # the waiter, as a timeout would
            await until(lambda: not host_processes_with(marker), "the command to die with its waiter", seen=lambda: host_processes_with(marker))
        finally:
            for pid in host_processes_with(marker):
                os.kill(pid, signal.SIGKILL)
            await command.wait()
            command.close()
