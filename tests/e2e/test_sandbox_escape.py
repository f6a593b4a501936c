"""The escape suite through the public API: the official `openai` client drives a real
`cairn serve`, a scripted model runs the escape attempts as shell commands, and every case
asserts on the host afterwards, checks the server is healthy and that the next command in
the same session still works (issue 3, design invariant 8).

The backend-level twin with tighter limits is tests/conformance/sandbox/test_sandbox_escape.py;
here the server's default limits apply (1 GiB memory and file size, 256 processes). The
server is started once per isolating backend that works on this host (`CAIRN_SANDBOX`
forces it); what only a pid namespace gives is checked where "process_isolation" is declared.
"""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from cairn.errors import SandboxError
from cairn.sandbox import select_backend
from cairn.sandbox.bwrap_sessions import SessionBwrapBackend
from cairn.sandbox.selection import ISOLATING_BACKENDS
from cairn.sandbox.testing import LoopbackListeners, host_processes_with
from cairn.testing.server import CairnServer
from tests.e2e.conftest import ROOT, make_server, remove_server
from tests.waits import until_blocking

SECRET = f"server-secret-{uuid.uuid4().hex}"
STILL_WORKS = {"call": "shell", "arguments": {"command": "echo still-works"}}


@pytest.fixture(scope="module", params=tuple(ISOLATING_BACKENDS))
def isolates_processes(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """The backend under test, and whether it hides host processes (a pid namespace)."""
    try:
        backend = select_backend(request.param)
    except SandboxError as exc:
        pytest.skip(f"backend {request.param!r} does not work on this host: {exc.message}")
    return request.param, "process_isolation" in backend.capabilities


@pytest.fixture(scope="module")
def escape_server(
    scripts_dir: Path, isolates_processes: tuple[str, bool]
) -> Iterator[CairnServer]:
    env = {"CAIRN_E2E_SECRET": SECRET, "CAIRN_SANDBOX": isolates_processes[0]}
    instance = make_server(scripts_dir, env=env).start()
    yield instance
    remove_server(instance)


class Session:
    """One session that played a script of shell commands, and what the host saw."""

    def __init__(self, server: CairnServer, session_id: str, commands: list[Any]) -> None:
        self.server = server
        self.id = session_id
        self.commands = commands

    @property
    def workspace(self) -> Path:
        return self.server.data_dir / "workspaces" / self.id

    def output(self, index: int) -> str:
        return str(self.commands[index].output or "")

    def assert_contained(self) -> None:
        """The server is healthy and the command after the attempt worked."""
        health = httpx.get(self.server.base_url.removesuffix("/v1") + "/healthz", timeout=5)
        assert health.status_code == 200
        last = self.commands[-1]
        assert (last.exit_code, last.output.strip()) == (0, "still-works")


def play(server: CairnServer, scripts_dir: Path, commands: Sequence[Mapping[str, Any]]) -> Session:
    """Run `commands` (shell arguments) then `echo still-works` in a new session's one turn."""
    name = f"escape_{uuid.uuid4().hex[:10]}"
    steps = [{"call": "shell", "arguments": dict(arguments)} for arguments in commands]
    script = {"turns": [[*steps, STILL_WORKS, {"say": "done"}]]}
    (scripts_dir / f"{name}.json").write_text(json.dumps(script))
    with server.client() as client:
        sessions = client.beta.agents.sessions
        with sessions.create(
            agent={"model": f"scripted:{name}", "instructions": "Try to escape."},
            environment={"type": "openai_hosted"},
            input="go",
            stream=True,
        ) as stream:
            events = list(stream)
        session_id = events[0].session.id
        assert events[-1].type == "agent.session.idle"
        items = list(sessions.items.list(session_id, order="asc", limit=100))
    commands = [item for item in items if item.type == "command_execution"]
    assert len(commands) == len(steps) + 1
    return Session(server, session_id, commands)


def test_writes_outside_the_workspace(escape_server: CairnServer, scripts_dir: Path) -> None:
    host_dir = escape_server.data_dir.parent
    canary = host_dir / "canary.txt"
    canary.write_text("host canary\n")
    name = f"escape-{uuid.uuid4().hex[:8]}"
    absolute = [canary, host_dir / name, Path("/etc") / name, Path("/usr") / name, Path("/") / name]
    command = "; ".join(
        [f"echo pwned > {target}" for target in absolute]
        + [f"echo pwned > ../{name}", f"echo pwned > ../../{name}",
           f"echo pwned > /workspace/../{name}", f"ln -s {canary} planted"]
    )
    session = play(
        escape_server, scripts_dir,
        [{"command": command}, {"command": "echo pwned > planted; cat planted"},
         {"command": f"mount -o remount,rw /usr && echo pwned > /usr/{name}; "
                     f"unshare -Urm sh -c 'mount -o remount,rw /usr && echo pwned > /usr/{name}'"}],
    )
    assert canary.read_text() == "host canary\n"
    for target in [*absolute[1:], session.workspace.parent / name, Path("/usr") / name]:
        assert not target.exists(), target
    assert "host canary" not in session.output(1)
    session.assert_contained()


def test_host_secrets_and_processes(
    escape_server: CairnServer, scripts_dir: Path, isolates_processes: tuple[str, bool]
) -> None:
    server_pid = escape_server.process.pid if escape_server.process else 0
    session = play(
        escape_server, scripts_dir,
        [{"command": "cat /etc/shadow; env; cat /proc/1/environ; cat /proc/*/environ; "
                     "echo; ls /proc | grep -c '^[0-9]'"},
         {"command": f"kill -9 {server_pid}; kill -9 -1; grep -l 'cairn[.]cli' /proc/*/cmdline"}],
    )
    secrets_output = session.output(0)
    assert SECRET not in secrets_output
    assert "root:" not in secrets_output
    assert str(ROOT) not in secrets_output  # not even the server's working directory
    if isolates_processes[1]:
        assert int(secrets_output.split()[-1]) < 10  # only the sandbox's own processes
        assert "cmdline" not in session.output(1)
    session.assert_contained()  # the server survived the kill attempts


def test_no_network_to_host_loopback(escape_server: CairnServer, scripts_dir: Path) -> None:
    with LoopbackListeners() as listeners:
        script = listeners.probe_script()
        session = play(
            escape_server, scripts_dir,
            [{"command": f"cat > probe.py <<'EOF'\n{script}EOF\npython3 probe.py"}],
        )
        assert "TCP-OK" not in session.output(0)
        assert not listeners.received_anything()
    session.assert_contained()


def test_resource_exhaustion_is_bounded(escape_server: CairnServer, scripts_dir: Path) -> None:
    marker = f"cairn-e2e-{uuid.uuid4().hex}"
    session = play(
        escape_server, scripts_dir,
        [
            {"command": f"bomb() {{ bomb | bomb & }}; bomb; : {marker}", "timeout_ms": 5000},
            {"command": "python3 -c \"b = b'x' * (3 * 1024 ** 3); print('ALLOCATED')\""},
            {"command": "dd if=/dev/zero of=big bs=1M count=1100 2>&1 | tail -1; ls -l big"},
            {"command": f"sh -c 'sleep 600; : {marker}'", "timeout_ms": 1000},
            {"command": f"sh -c 'sleep 600; : {marker}' > /dev/null 2>&1 & "
                        f"setsid sh -c 'sleep 600; : {marker}' > /dev/null 2>&1 & echo left"},
        ],
    )
    assert "ALLOCATED" not in session.output(1)
    assert session.commands[1].exit_code != 0
    big = session.workspace / "big"
    assert big.stat().st_size <= 1024 ** 3  # the file-size limit, not the disk, stopped it
    assert "timed out" in session.output(3) and session.commands[3].exit_code is None
    assert "left" in session.output(4)
    assert host_processes_with(marker) == []
    big.unlink()
    session.assert_contained()


def test_two_sessions_cannot_see_each_other(
    escape_server: CairnServer, scripts_dir: Path
) -> None:
    marker = f"cairn-e2e-{uuid.uuid4().hex}"
    pattern = f"cairn-e2[e]-{marker.rsplit('-', 1)[1]}"
    holder: dict[str, Session] = {}

    def hold() -> None:
        holder["first"] = play(
            escape_server, scripts_dir,
            [{"command": f"echo secret > {marker}.txt; touch ready; sh -c 'sleep 30; : {marker}'",
              "timeout_ms": 4000}],
        )

    thread = threading.Thread(target=hold)
    thread.start()
    workspaces = escape_server.data_dir / "workspaces"
    try:
        # The first session's command is running once its ready file exists on the host.
        subprocess.run(
            ["sh", "-c", f"until ls {workspaces}/*/ready >/dev/null 2>&1; do sleep 0.05; done"],
            timeout=30, check=True,
        )
        second = play(
            escape_server, scripts_dir,
            [{"command": f"ls -a /workspace/..; grep -l '{pattern}' /proc/*/cmdline; "
                         f"find / -name '{pattern}*' 2>/dev/null; cat ../*/{pattern}.txt"}],
        )
    finally:
        thread.join(timeout=60)
    assert marker not in second.output(0)
    assert "secret" not in second.output(0)
    assert holder["first"].id not in second.output(0)
    second.assert_contained()
    holder["first"].assert_contained()


def test_a_deleted_session_leaves_no_sandbox_behind(
    escape_server: CairnServer, scripts_dir: Path, isolates_processes: tuple[str, bool]
) -> None:
    """Where the backend keeps a container per session (bwrap), the session's commands share
    its /tmp and its container runs between them; once the session is deleted, nothing of
    its sandbox is left on the host."""
    keeps_container = isinstance(select_backend(isolates_processes[0]), SessionBwrapBackend)
    session = play(
        escape_server, scripts_dir,
        [{"command": "echo kept > /tmp/kept-here"}, {"command": "cat /tmp/kept-here || echo fresh"}],
    )
    assert session.output(1).strip().endswith("kept" if keeps_container else "fresh")
    container = f"{session.workspace}\0/workspace\0"  # in bwrap's command line
    assert bool(host_processes_with(container)) is keeps_container
    session.assert_contained()
    with escape_server.client() as client:
        assert client.beta.agents.sessions.delete(session.id).deleted
    until_blocking(
        lambda: not host_processes_with(container), "the deleted session's sandbox to end", timeout_s=30,
        seen=lambda: f"its processes {host_processes_with(container)}",
    )
