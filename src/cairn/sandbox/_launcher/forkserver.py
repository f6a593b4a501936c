"""The fork server: one long-lived launcher per backend that forks a child per command.

Starting an interpreter per command costs 7-20 ms before any confinement work (~1 ms), so
the server starts this program once (`cairn.sandbox._forkserver`) and sends it one message
per command over a SOCK_SEQPACKET socket: a byte, with three file descriptors attached —
the memfd holding the `LaunchSpec`, the write end of the command's output pipe, and one
end of a per-command status socket — and optionally more, which the child receives
as `PASSED_FD`, `PASSED_FD + 1`... It forks; the child makes the pipe its stdout and stderr, /dev/null its
stdin, starts a new session, closes everything else and runs the launcher (`main.run`).
The fork server sends the child's pid (with a pidfd attached) on the status socket, and
its wait status when it ends (it is the child's parent, so it reaps it), then closes it.

A request whose byte is `JOIN` carries a container's init as that fourth descriptor (a
pidfd): the child is forked straight into that init's pid namespace, and the fork server
returns to its own at once, before anything else can be forked (or dies trying: nothing
may ever be forked into the wrong container). The child enters the container's other
namespaces itself (`main.py`), with no process left between it and the fork server; its
status is relayed as a shell reports it (128 + signal when killed), as bwrap would.

It stays single-threaded and small, so forking it is cheap and safe. When the server's end
of the control socket closes (the server exited or died), it SIGKILLs the process groups
of the children still running and exits: nothing it started outlives the server.
"""

from __future__ import annotations

import _socket
import marshal
import os
import select
import sys

from .main import LAUNCH_FAILED, run
from .spec import PASSED_FD
from .syscalls import setns

__all__ = ["JOIN", "serve"]

JOIN = b"j"
_SCM_RIGHTS = 1
_SOL_SOCKET = 1
# The spec, the output pipe, the status socket and up to two passed descriptors.
_MAX_FDS_PER_REQUEST = 5
_SIGKILL = 9
_CLONE_NEWPID = 0x20000000

# pidfd -> (pid, status socket, whether its status is relayed as a shell reports it)
_Children = dict[int, tuple[int, _socket.socket, bool]]


def serve(control_fd: int) -> None:
    control = _socket.socket(fileno=control_fd)
    own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    poller = select.poll()
    poller.register(control.fileno(), select.POLLIN)
    children: _Children = {}
    while True:
        for fd, _ in poller.poll():
            if fd == control.fileno():
                if not _accept(control, children, poller, own_pid_namespace):
                    _kill_all(children)
                    return
            else:
                pid, status, relayed = children.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                _, code = os.waitpid(pid, 0)
                if relayed and os.WIFSIGNALED(code):
                    code = ((128 + os.WTERMSIG(code)) & 0xFF) << 8
                _send(status, ("exit", code))
                status.close()


def _accept(
    control: _socket.socket, children: _Children, poller: select.poll, own_pid_namespace: int
) -> bool:
    """Fork one command; return False when the server has gone away."""
    data, ancillary, _, _ = control.recvmsg(1, _socket.CMSG_SPACE(4 * _MAX_FDS_PER_REQUEST))
    fds = [
        int.from_bytes(cmsg_data[i : i + 4], sys.byteorder, signed=True)
        for level, kind, cmsg_data in ancillary
        if level == _SOL_SOCKET and kind == _SCM_RIGHTS
        for i in range(0, len(cmsg_data) - len(cmsg_data) % 4, 4)
    ]
    if not data:
        return False
    spec_fd, output_fd, status_fd, *passed = fds
    status = _socket.socket(fileno=status_fd)
    joins = data == JOIN
    try:
        if joins:
            setns(passed[0], _CLONE_NEWPID)  # for the next child only
    except OSError as exc:  # the container is gone
        _send(status, ("error", exc.errno or 0))
        status.close()
        pid = 0
    else:
        try:
            pid = os.fork()
        except BaseException:
            if joins:
                _leave_container(own_pid_namespace, children)
            raise
        if pid == 0:
            _become_command(spec_fd, output_fd, passed)
        if joins:
            _leave_container(own_pid_namespace, children)
    for fd in (spec_fd, output_fd, *passed):
        os.close(fd)
    if pid:
        pidfd = os.pidfd_open(pid)
        children[pidfd] = (pid, status, joins)
        poller.register(pidfd, select.POLLIN)
        _send(status, ("pid", pid), pidfd)
    return True


def _leave_container(own_pid_namespace: int, children: _Children) -> None:
    """Fork into this process's own pid namespace again; if that fails, die (killing what
    runs) rather than fork the next command into a container that is not its own."""
    try:
        setns(own_pid_namespace, _CLONE_NEWPID)
    except OSError:
        _kill_all(children)
        os._exit(LAUNCH_FAILED)


def _become_command(spec_fd: int, output_fd: int, passed: list[int]) -> None:
    try:
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        os.setsid()
        # Copies first (fresh numbers, so moving one cannot overwrite the other), then
        # into place: the spec at 3, the passed descriptors from PASSED_FD (4) on.
        moves = [(os.dup(spec_fd), 3)]
        moves += [(os.dup(fd), PASSED_FD + index) for index, fd in enumerate(passed)]
        for fd, number in moves:
            if fd != number:
                os.dup2(fd, number)  # inheritable
        os.closerange(moves[-1][1] + 1, os.sysconf("SC_OPEN_MAX"))
        with os.fdopen(3, "rb") as source:
            spec = marshal.load(source)
    except BaseException:  # noqa: BLE001 - a forked child must never return into the loop
        os._exit(LAUNCH_FAILED)
    run(spec)
    os._exit(LAUNCH_FAILED)  # run() execs or exits; this is never reached


def _send(status: _socket.socket, message: tuple[str, int], fd: int | None = None) -> None:
    """Send `message`, with `fd` attached (the pidfd, so the server signals no recycled pid)."""
    ancillary = [] if fd is None else [(_SOL_SOCKET, _SCM_RIGHTS, fd.to_bytes(4, sys.byteorder))]
    try:
        status.sendmsg([marshal.dumps(message)], ancillary)
    except OSError:
        pass  # the server stopped waiting for this command (it was cancelled and closed)


def _kill_all(children: _Children) -> None:
    for pid, _, _ in children.values():
        try:
            os.killpg(pid, _SIGKILL)
        except ProcessLookupError:
            pass
