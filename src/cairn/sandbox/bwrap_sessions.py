"""The default sandbox: bubblewrap, one warm container per session workspace (invariant 8).

Starting a bwrap container costs ~10 ms of namespace and mount work per command (most of
it RCU grace periods the kernel waits for; docs/sandbox.md). Here it is paid once: the
container, with the profile of `bwrap.py` (every namespace unshared, uid/gid 1000 in a user
namespace without capabilities or nested user namespaces, read-only root, generated /etc,
the workspace at /workspace), is started on a workspace's first command, for each network
setting, running `sleep` as a minimal init under bwrap's reaper. Each command's launcher
(the fork server's child, host root) then joins the command's cgroup leaves and sets its
rlimits as before, enters the container's user, mount, pid, uts and net namespaces
through its init's pidfd, takes fresh ipc and cgroup namespaces, forks into the pid
namespace, drops for good to uid/gid 1000 with no capabilities (empty bounding set,
no_new_privs), enters a Landlock domain of its own and execs `/bin/sh -c` with only
stdin, stdout and stderr open (`_launcher/main.py`).

What keeps a command from outliving itself or reaching beyond its session:
- its processes are found through its cgroup leaves and killed when it ends (the
  container's pid namespace outlives it); so this form needs a writable cgroup;
- the container's init lives outside those leaves, so commands must not be able to trace
  or signal it (a traced init could fork a process no cgroup tracks): the Landlock scope
  (ABI >= 6) denies ptrace, /proc/<pid>/mem and signals to any process outside the
  command's own domain, which also keeps concurrent commands of a session off each other,
  and the container's /proc (hidepid=invisible) lists only what a command may trace;
- nothing that accumulates outlives the command unbounded: /tmp and /dev/shm are tmpfs
  of a fixed size (they are the session's, kept until its container goes), /dev is
  read-only, SysV IPC is the command's own;
- the container dies with the server (`--die-with-parent` on bwrap, whose parent is the
  fork server, which kills its children when the server goes) and is replaced, never
  bypassed, when it dies (`_session_containers.py`).
`detect_bwrap` chooses this form where it works and says why not otherwise; the fallback
is a container per command (`bwrap.py`), which needs neither cgroups nor Landlock.

Network: a container always has its own network namespace with loopback only. A session
with network gets a container of its own for it, whose one way out is Cairn's egress
proxy (`egress/`): the proxy listens on 127.0.0.1:3128 inside the container's namespace
for that session only, commands get the proxy variables and trust Cairn's CA (copied into
the container's /etc when it starts), and a program that ignores the proxy reaches nothing.
"""

from __future__ import annotations

import json
import logging
import os
import select
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from cairn.errors import SandboxError
from cairn.sandbox._account import SandboxAccount, resolve_sandbox_account
from cairn.sandbox._cgroups import discover_cgroups
from cairn.sandbox._containment import CommandContainment, Containment
from cairn.sandbox._env import DEFAULT_PATH
from cairn.sandbox._launch import Handoff
from cairn.sandbox._launcher.landlock import SCOPING_ABI, abi_version
from cairn.sandbox._launcher.spec import PASSED_FD
from cairn.sandbox._launcher.syscalls import reconfigure_mount
from cairn.sandbox._session_containers import ContainerKey, SessionContainer, SessionContainers
from cairn.sandbox._workspace import WorkspaceIdentity, hand_over_workspace, workspace_identity
from cairn.sandbox.base import WORKSPACE_MOUNT, ExecRequest
from cairn.sandbox.bwrap import (
    PER_COMMAND,
    SANDBOX_UID,
    BwrapBackend,
    bwrap_usage,
    locate_bwrap,
    workspace_argv,
)
from cairn.sandbox.egress.netns import listen_in_namespace

if TYPE_CHECKING:
    from cairn.sandbox._launcher.spec import LaunchSpec

__all__ = ["DEFAULT_IDLE_S", "DEFAULT_MAX_AGE_S", "SessionBwrapBackend", "detect_bwrap"]

logger = logging.getLogger(__name__)

DEFAULT_IDLE_S = 300.0
# A busy session's container is replaced after this long, so its copy of /etc stays recent.
DEFAULT_MAX_AGE_S = 3600.0
_MIB = 1024 * 1024
TMP_BYTES = 1024 * _MIB  # as much as one command may hold in memory by default
SHM_BYTES = 64 * _MIB
_READY = b"cairn-session-container-ready\n"
# The init: say the container is set up (bwrap execs it only then), then wait for the end.
_INIT = f"echo {_READY.decode().strip()} && exec /bin/sleep infinity"
_START_TIMEOUT_S = 30.0


class SessionBwrapBackend(BwrapBackend):
    """bwrap with one container per session workspace and network setting that every
    command joins; see the module docstring."""

    def __init__(
        self,
        *,
        bwrap: str,
        account: SandboxAccount | None,
        containment: Containment,
        landlock_abi: int,
        file_perms: bool = True,
        idle_s: float = DEFAULT_IDLE_S,
        max_age_s: float = DEFAULT_MAX_AGE_S,
    ) -> None:
        super().__init__(
            bwrap=bwrap, account=account, containment=containment, file_perms=file_perms
        )
        self._landlock_abi = landlock_abi
        self._tmpfs_argv = [
            "--size", str(TMP_BYTES), "--tmpfs", "/tmp",
            "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm",
            "--remount-ro", "/dev",  # non-recursive: /dev/shm and the device binds stay as they are
        ]
        self._containers = SessionContainers(self._start_container, idle_s=idle_s, max_age_s=max_age_s)
        self._tmp_note = (
            f"/tmp ({TMP_BYTES // _MIB} MiB) and /dev/shm ({SHM_BYTES // _MIB} MiB) are tmpfs "
            "private to the session: kept between its commands, gone with its container"
        )
        self.containers = (
            "one bwrap container per session workspace and network setting, started on its "
            f"first command and kept until {idle_s:g} s without one or the session is "
            f"suspended or deleted (replaced once {max_age_s:g} s old); each command joins it in "
            "a Landlock domain of its own and a fresh ipc and cgroup namespace"
        )

    @property
    def isolation(self) -> Mapping[str, str]:
        return {
            **super().isolation,
            "filesystem": (
                "only the workspace (read-write at /workspace), /tmp and /dev/shm are "
                f"writable; {self._tmp_note}; /usr and selected /etc files (copied when the "
                "container starts) are read-only; the rest of the host filesystem is absent"
            ),
            "processes": (
                "own pid and uts namespaces per session, own ipc and cgroup namespaces per "
                "command; a command sees, traces and signals only its own processes (/proc "
                "hidepid=invisible, Landlock scope): not the container's init, not the "
                "session's other commands, not the host's"
            ),
        }

    async def release_workspace(self, workspace: Path) -> None:
        self._containers.release(str(workspace))
        await super().release_workspace(workspace)

    @asynccontextmanager
    async def _container(
        self, request: ExecRequest, identity: WorkspaceIdentity
    ) -> AsyncIterator[int | None]:
        key = ContainerKey(workspace=str(request.workspace), network=request.network)
        if request.egress is not None:
            self._admit(request)
            key = ContainerKey(key.workspace, network=True, session_id=request.egress.session_id)
        async with self._containers.lease(key, identity) as init_pidfd:
            yield init_pidfd

    def _command(
        self, request: ExecRequest, scratch: Path | None
    ) -> tuple[list[str], dict[str, str], str]:
        return ["/bin/sh", "-c", request.command], self._command_env(request), WORKSPACE_MOUNT

    def _files(self, request: ExecRequest) -> list[tuple[int, str | bytes]]:
        return []  # the container got its /etc files when it started

    @asynccontextmanager
    async def _handoff(self, request: ExecRequest) -> AsyncIterator[Handoff | None]:
        yield None  # the container's door to the proxy was opened when it started

    def _spec(
        self, request: ExecRequest, contained: CommandContainment, scratch: Path | None
    ) -> LaunchSpec:
        spec = super()._spec(request, contained, scratch)
        spec["user"] = (SANDBOX_UID, SANDBOX_UID)  # of the container's user namespace
        spec["join"] = {"landlock_abi": self._landlock_abi}
        return spec

    def _start_container(self, key: ContainerKey, identity: WorkspaceIdentity) -> SessionContainer:
        """Start the container for `key` and wait until it is set up (blocking).

        bwrap reports its init's host pid on the pipe passed as `--info-fd` before it lets
        the init run; the init's first output says the setup is done. Raises `SandboxError`
        with bwrap's own words when it fails.
        """
        trust_argv, trust = self._trust_argv() if key.network else ([], [])
        spec: LaunchSpec = {
            "argv": [
                *self._fixed_argv, *self._tmpfs_argv, *trust_argv,
                *workspace_argv(Path(key.workspace)),
                "--info-fd", str(PASSED_FD), "--", "/bin/sh", "-c", _INIT,
            ],
            # The environment bwrap's own processes keep (the init's is cleared).
            "env": {"PATH": DEFAULT_PATH},
            "cwd": "/",
            "workspace": key.workspace,
            "cgroup_join": [],
            "rlimits": [],
            "user": None if self._account is None else (self._account.uid, self._account.gid),
            "network": key.network,
            "seccomp": False,
            "files": [*self._etc_files, *trust],
            "rootfs": None,
            "landlock": None,
            "join": None,
        }
        info_read, info_write = os.pipe2(os.O_CLOEXEC)
        try:
            try:
                monitor = self._forks.start(spec, info_write)
            finally:
                os.close(info_write)
            try:
                output = monitor.output_blocking(_READY, _START_TIMEOUT_S)
                if _READY not in output:
                    raise SandboxError(
                        "the session container did not start: "
                        + output.decode(errors="replace").strip()
                    )
                init_pid, init_pidfd = _open_init(info_read, monitor.pid)
                try:
                    if monitor.has_exited():  # its pid may be anyone's now: so may the init's
                        raise SandboxError("the session container ended as it started")
                    _hide_foreign_processes(init_pid, init_pidfd)
                    close_door = self._open_egress(key, init_pidfd)
                except BaseException:
                    os.close(init_pidfd)
                    raise
            except BaseException:
                monitor.kill()
                monitor.close()
                raise
        finally:
            os.close(info_read)
        return SessionContainer(monitor, init_pidfd, identity, on_close=close_door)

    def _open_egress(self, key: ContainerKey, init_pidfd: int) -> Callable[[], None] | None:
        """For a container with network: the proxy's listener in its namespace, served as
        `key.session_id`'s; returns what closes it (blocking)."""
        if not key.network:
            return None
        return self.egress.serve(listen_in_namespace(init_pidfd), key.session_id)

    def _probe_session(self) -> None:
        """Start a container and run `true` in it as every command runs; raise
        `SandboxError` with why it failed (blocking)."""
        with tempfile.TemporaryDirectory(prefix="cairn-bwrap-probe-") as probe:
            workspace = Path(probe)
            hand_over_workspace(workspace, self._account)
            container = self._start_container(
                ContainerKey(workspace=probe, network=False), workspace_identity(workspace)
            )
            try:
                self._probe(workspace, None, container.init_pidfd)
            finally:
                container.kill()
                container.close()


def _open_init(info_fd: int, monitor_pid: int) -> tuple[int, int]:
    """The pid of the init bwrap reported on `info_fd`, checked to be the monitor's child,
    and a pidfd for it.

    The report was written before the init could run, so it is complete by now.
    """
    os.set_blocking(info_fd, False)
    report = b""
    while True:
        try:
            chunk = os.read(info_fd, 4096)
        except BlockingIOError:
            break  # all there is: the rest of the pipe's writers are the container's
        if not chunk:
            break
        report += chunk
    try:
        init_pid = int(json.loads(report)["child-pid"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SandboxError(f"bwrap did not report its container's pid: {report!r}") from exc
    try:
        init_pidfd = os.pidfd_open(init_pid)
    except OSError as exc:
        raise SandboxError(f"the session container's init {init_pid} is gone: {exc}") from exc
    if _parent_of(init_pid) != monitor_pid:
        os.close(init_pidfd)
        raise SandboxError(f"process {init_pid} is not the session container bwrap started")
    return init_pid, init_pidfd


def _hide_foreign_processes(init_pid: int, init_pidfd: int) -> None:
    """Mount the container's /proc with hidepid=invisible: a command then lists only the
    processes it may trace, which Landlock's scope makes its own. The container's init,
    the session's other commands and a launcher on its way in (a host-root process for a
    moment, with the fork server's command line) are not even listed.

    The mount is reached through the init's root; that the init is still alive once it
    is picked proves its pid was not reused, so the mount is the container's.
    """

    def still_the_container() -> None:
        if select.select([init_pidfd], [], [], 0)[0]:
            raise SandboxError("the session container ended as it started")

    try:
        reconfigure_mount(
            f"/proc/{init_pid}/root/proc", {"hidepid": "invisible"}, before=still_the_container
        )
    except OSError as exc:
        raise SandboxError(f"could not hide other processes from the session's commands: {exc}") from exc


def _parent_of(pid: int) -> int:
    """`pid`'s parent, or 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("PPid:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        return 0
    return 0


def detect_bwrap(
    *, session_containers: bool | None = None, idle_s: float = DEFAULT_IDLE_S
) -> BwrapBackend:
    """The bwrap backend for this host, proven to work by running `true` (blocking).

    `session_containers`: None chooses session containers where they work here and a
    container per command otherwise (the backend's `containers` says which, and why);
    True requires them (`SandboxError` if they do not work), False never uses them.
    Raises `SandboxError` saying why bwrap cannot isolate here at all.
    """
    if session_containers is False:
        return BwrapBackend.detect()
    bwrap = locate_bwrap()
    usage = bwrap_usage(bwrap)
    cgroups = discover_cgroups()
    abi = abi_version()
    if not cgroups.in_use:
        reason = "no writable cgroup to find a command's processes in"
    elif abi < SCOPING_ABI:
        reason = (
            f"Landlock ABI {abi} (< {SCOPING_ABI}) cannot keep commands from tracing or "
            "signalling the container's init"
        )
    elif b"--size" not in usage:
        reason = f"{bwrap} has no --size option to limit the session's /tmp (bubblewrap < 0.7)"
    else:
        account = resolve_sandbox_account()
        backend = SessionBwrapBackend(
            bwrap=bwrap,
            account=account,
            containment=Containment(cgroups=cgroups, nproc_counts=account is not None),
            landlock_abi=abi,
            file_perms=b"--perms" in usage,
            idle_s=idle_s,
        )
        try:
            backend._probe_session()
        except SandboxError as exc:
            reason = exc.message
        else:
            return backend
    if session_containers:
        raise SandboxError(f"bwrap session containers do not work on this host: {reason}")
    logger.warning("bwrap session containers do not work here (%s): a container per command", reason)
    fallback = BwrapBackend.detect()
    fallback.containers = f"{PER_COMMAND} (session containers unavailable: {reason})"
    return fallback
