"""The server's side of the fork server (`_launcher/forkserver.py`): start it, ask it for
commands, and supervise each command through an async handle.

Every backend starts its commands this way: the fork server is started once per backend
(lazily, on the first command) as `python -I -S -B -c <bootstrap>` — no site-packages, no
environment, none of the server's modules — and forks a small child per command, instead
of the threaded server forking itself (unsafe for Python code in the child) or starting an
interpreter (7-20 ms) or an exec chain (`sh`, `prlimit`, `setpriv`) per command. The spec
travels in a memfd, never on a command line. The fork server exits when this side's
control socket closes, killing whatever it still runs.
"""

from __future__ import annotations

import array
import fcntl
import marshal
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from cairn.errors import CairnMisuseError, SandboxError
from cairn.sandbox import _launcher
from cairn.sandbox._env import DEFAULT_PATH
from cairn.sandbox._launcher.forkserver import JOIN

if TYPE_CHECKING:
    from cairn.sandbox._launcher.spec import LaunchSpec

__all__ = ["ForkServer", "ForkedCommand", "output_pipe", "read_output"]

_LAUNCHER_DIR = str(Path(_launcher.__file__).parent)
# Loads the `_launcher` directory as package `cairn_launcher` and serves. The import
# machinery comes from the frozen modules every interpreter has loaded already
# (`importlib.util` would import `contextlib` and `collections`, ~5 ms).
_BOOTSTRAP = (
    "import sys\n"
    "from _frozen_importlib import module_from_spec\n"
    "from _frozen_importlib_external import spec_from_file_location\n"
    "d = sys.argv[1]\n"
    "s = spec_from_file_location('cairn_launcher', d + '/__init__.py', "
    "submodule_search_locations=[d])\n"
    "m = module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m)\n"
    "from cairn_launcher.forkserver import serve\n"
    "serve(int(sys.argv[2]))\n"
)
# A command's output pipe holds 256 KiB (the default is 64 KiB) and is read up to 256 KiB
# at a time: with the default pipe a fast writer (`tar`) stalls whenever the server is not
# scheduled at once, and every 64 KiB costs a wake-up (20-30 % of tar's throughput on the
# reference host, back to back; 1 MiB measured no better). 256 KiB keeps a non-root
# server below the per-user pipe quota (64 MiB, /proc/sys/fs/pipe-user-pages-soft) up to
# 256 running commands. Memory stays bounded: one pipe in the kernel, one read here.
OUTPUT_PIPE_SIZE = 256 * 1024
OUTPUT_READ_SIZE = 256 * 1024
_STOP_TIMEOUT_S = 5.0


class ForkServer:
    """One fork server process; `start` runs one command in a fresh child of it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._control: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def start(
        self, spec: LaunchSpec, passed_fd: int | None = None, *, joins: bool = False, next_fd: int | None = None
    ) -> ForkedCommand:
        """Hand `spec` to the fork server; the command's pid arrives via `ForkedCommand.started`.

        `passed_fd` (a copy of it; the caller keeps its own) reaches the launcher as
        `PASSED_FD`, and `next_fd` (with a `passed_fd` only) as `PASSED_FD + 1`; with
        `joins` `passed_fd` is a container init's pidfd, and the command is
        forked into that init's pid namespace (`_launcher/forkserver.py`). Blocking only
        for a few system calls (and, the first time, for starting the fork server).
        Raises `SandboxError` if the fork server cannot be reached.
        """
        output_read, output_write = output_pipe()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        spec_fd = os.memfd_create("cairn-launch-spec")
        try:
            os.write(spec_fd, marshal.dumps(dict(spec)))
            os.lseek(spec_fd, 0, os.SEEK_SET)
            passed = [fd for fd in (passed_fd, next_fd) if fd is not None]
            if next_fd is not None and passed_fd is None:
                raise CairnMisuseError("next_fd needs a passed_fd")
            fds = array.array("i", [spec_fd, output_write, theirs.fileno(), *passed])
            with self._lock:
                control = self._running()
                try:
                    control.sendmsg(
                        [JOIN if joins else b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]
                    )
                except OSError as exc:
                    self._control = None  # start a new fork server next time
                    raise SandboxError(f"the sandbox fork server is gone: {exc}") from exc
        except BaseException:
            os.close(output_read)
            ours.close()
            raise
        finally:
            os.close(spec_fd)
            os.close(output_write)
            theirs.close()
        return ForkedCommand(self, output_read, ours)

    def _running(self) -> socket.socket:
        if self._control is not None and self._process is not None and self._process.poll() is None:
            return self._control
        if self._control is not None:
            self._control.close()  # a fork server that died: start a new one
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "-c", _BOOTSTRAP, _LAUNCHER_DIR,
                 str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env={"PATH": DEFAULT_PATH},
                cwd="/",
                start_new_session=True,  # terminal signals aimed at the server stay there
            )
        except OSError as exc:
            ours.close()
            raise SandboxError(f"could not start the sandbox fork server: {exc}") from exc
        finally:
            theirs.close()
        self._control, self._process = ours, process
        weakref.finalize(self, _stop, ours, process)
        return ours


def output_pipe() -> tuple[int, int]:
    """A close-on-exec pipe (read end, write end) for a command's output, widened if allowed.

    Past the per-user pipe quota (/proc/sys/fs/pipe-user-pages-soft) the kernel refuses to
    widen it; the default size then only costs throughput.
    """
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(read_end, fcntl.F_SETPIPE_SZ, OUTPUT_PIPE_SIZE)
    except OSError:
        pass
    return read_end, write_end


async def read_output(fd: int) -> AsyncIterator[bytes]:
    """What is written to the pipe `fd` (non-blocking), as it arrives, until end-of-file."""
    while True:
        try:
            chunk = os.read(fd, OUTPUT_READ_SIZE)
        except BlockingIOError:
            await anyio.wait_readable(fd)
            continue
        if not chunk:
            return
        yield chunk


def _stop(control: socket.socket, process: subprocess.Popen[bytes]) -> None:
    """Closing the control socket tells the fork server to kill its children and exit."""
    control.close()
    try:
        process.wait(timeout=_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class ForkedCommand:
    """An async handle on one command the fork server forked (see `_process.py`).

    It keeps its `ForkServer` alive: the fork server kills its children when dropped.
    """

    def __init__(self, server: ForkServer, output_fd: int, status: socket.socket) -> None:
        self._server = server
        os.set_blocking(output_fd, False)
        status.setblocking(False)
        self._output_fd: int | None = output_fd
        self._status = status
        self._pidfd: int | None = None
        self._start_error: SandboxError | None = None
        self.pid = 0
        self.returncode: int | None = None

    async def started(self) -> None:
        """Wait for the fork server to report the command's pid (and a pidfd to signal it).

        Raises `SandboxError` if it could not fork the command, again on every call.
        """
        if self._start_error is not None:
            raise self._start_error
        self._started(*await self._receive())

    async def wait(self) -> int:
        """Wait until the command's main process exits; its status, negative if signalled."""
        if self.returncode is None:
            kind, status, _ = await self._receive()
            if kind != "exit":
                raise SandboxError(f"unexpected message from the sandbox fork server: {kind}")
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the main process through its pidfd (never a recycled pid)."""
        if self.returncode is None and self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it exited already; `wait` will say how

    def output(self) -> AsyncIterator[bytes]:
        """The command's combined stdout and stderr, until every writer closed the pipe."""
        if self._output_fd is None:
            raise RuntimeError("the command's output was read after `close`")
        return read_output(self._output_fd)

    def close(self) -> None:
        if self._output_fd is not None:
            os.close(self._output_fd)
            self._output_fd = None
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self._status.close()

    def run_blocking(self, timeout_s: float) -> tuple[int, bytes]:
        """Run the command to its end without an event loop (startup probes); (status, output)."""
        deadline = time.monotonic() + timeout_s
        try:
            self._started_blocking(deadline)
            output = self._read_blocking(deadline, until=None)
            self._status.settimeout(max(deadline - time.monotonic(), 0.001))
            kind, status, _ = _parse(*self._status.recvmsg(64)[:2])
        except (OSError, ValueError) as exc:  # TimeoutError and socket timeouts are OSErrors
            self.kill()
            raise SandboxError(f"a sandboxed probe did not finish: {exc}") from exc
        return os.waitstatus_to_exitcode(status), output

    def output_blocking(self, until: bytes, timeout_s: float) -> bytes:
        """Block until the pid arrived and the output contains `until`, or ended; the
        output read so far (a program that announces it is ready: bwrap session containers).

        Raises `SandboxError` (after killing the command) if neither happens in time.
        """
        deadline = time.monotonic() + timeout_s
        try:
            self._started_blocking(deadline)
            return self._read_blocking(deadline, until=until)
        except (OSError, ValueError) as exc:
            self.kill()
            raise SandboxError(f"a sandboxed program did not start: {exc}") from exc

    def has_exited(self) -> bool:
        """Whether the main process has exited (without waiting; False before `started`)."""
        if self._pidfd is None:
            return False
        return bool(select.select([self._pidfd], [], [], 0)[0])

    def _started_blocking(self, deadline: float) -> None:
        self._status.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            message = _parse(*self._status.recvmsg(64, socket.CMSG_SPACE(4))[:2])
        finally:
            self._status.setblocking(False)
        self._started(*message)

    def _started(self, kind: str, value: int, fds: list[int]) -> None:
        if kind == "error":  # the fork server could not fork it (its container is gone)
            self._start_error = SandboxError(
                f"the sandbox could not start the command: {os.strerror(value)}"
            )
            raise self._start_error
        if kind != "pid" or len(fds) != 1:
            raise SandboxError(f"unexpected message from the sandbox fork server: {kind}")
        self.pid, self._pidfd = value, fds[0]

    def _read_blocking(self, deadline: float, *, until: bytes | None) -> bytes:
        output_fd = self._output_fd
        assert output_fd is not None
        output = b""
        while until is None or until not in output:
            readable, _, _ = select.select([output_fd], [], [], max(deadline - time.monotonic(), 0))
            if not readable:
                raise TimeoutError(f"no end of output within the time allowed: {output[-500:]!r}")
            chunk = os.read(output_fd, OUTPUT_READ_SIZE)
            if not chunk:
                break
            output += chunk
        return output

    async def _receive(self) -> tuple[str, int, list[int]]:
        while True:
            try:
                data, ancillary, _, _ = self._status.recvmsg(64, socket.CMSG_SPACE(4))
            except BlockingIOError:
                await anyio.wait_readable(self._status)
                continue
            return _parse(data, ancillary)


def _parse(data: bytes, ancillary: list[tuple[int, int, bytes]]) -> tuple[str, int, list[int]]:
    """One status message: ("pid", pid) with a pidfd attached, or ("exit", wait status)."""
    if not data:
        raise SandboxError("the sandbox fork server went away while a command ran")
    fds = array.array("i")
    for level, kind, cmsg_data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(cmsg_data[: len(cmsg_data) - len(cmsg_data) % fds.itemsize])
    message_kind, value = marshal.loads(data)
    return str(message_kind), int(value), list(fds)
