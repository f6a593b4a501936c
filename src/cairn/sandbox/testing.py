"""Host-side checks for sandbox tests: what runs and what arrived on the host after a command.

Escape and cleanup tests assert on the host, not on what a sandboxed command reports, so
backend-level and end-to-end suites share this one scan of the host's /proc, and the
workspaces they make live where the sandbox account can reach them.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cairn.sandbox.base import SandboxBackend

__all__ = ["LoopbackListeners", "host_processes_with", "new_workspace", "workspace_root"]


@contextmanager
def workspace_root(prefix: str) -> Iterator[Path]:
    """A fresh directory under the temp dir for test workspaces, removed afterwards.

    Mode 0711, unlike pytest's tmp_path (0700 under /tmp/pytest-of-root): the sandbox
    account must traverse it to reach a workspace.
    """
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o711)
    try:
        yield root
    finally:
        shutil.rmtree(root)


async def new_workspace(root: Path, backend: SandboxBackend) -> Path:
    """A new workspace under `root`, prepared for `backend`."""
    path = root / uuid.uuid4().hex[:12]
    path.mkdir()
    await backend.prepare_workspace(path)
    return path


def host_processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker`, the calling process excluded."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the process exited while we looked: it is not running
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


class LoopbackListeners:
    """A TCP listener and a UDP socket on host 127.0.0.1 that tell whether anything arrived.

    Use as a context manager; `probe_script` is Python source that a sandboxed command runs
    to try both, printing `TCP-OK` if a connection succeeded.
    """

    def __init__(self) -> None:
        self._tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for sock in (self._tcp, self._udp):
            sock.bind(("127.0.0.1", 0))
            sock.setblocking(False)
        self._tcp.listen()
        self.tcp_port: int = self._tcp.getsockname()[1]
        self.udp_port: int = self._udp.getsockname()[1]

    def __enter__(self) -> LoopbackListeners:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._tcp.close()
        self._udp.close()

    def probe_script(self, hosts: tuple[str, ...] = ("127.0.0.1",)) -> str:
        return (
            "import socket\n"
            f"for host in {hosts!r}:\n"
            "    try:\n"
            f"        socket.create_connection((host, {self.tcp_port}), timeout=2)\n"
            "        print('TCP-OK', host)\n"
            "    except OSError as error:\n"
            "        print('tcp', host, error)\n"
            "    try:\n"
            "        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"        udp.sendto(b'x', (host, {self.udp_port}))\n"
            "    except OSError as error:\n"
            "        print('udp', host, error)\n"
        )

    def received_anything(self) -> bool:
        """True if a TCP connection is waiting or a UDP datagram arrived."""
        try:
            connection, _ = self._tcp.accept()
        except BlockingIOError:
            try:
                self._udp.recvfrom(16)
            except BlockingIOError:
                return False
            return True
        connection.close()
        return True
