"""The default sandbox's per-command form: each command in a fresh bubblewrap container.

Design invariant 8. Where the host allows it, the default is its session form instead
(`bwrap_sessions.py`): the same container, started once per session workspace and
network setting, which every command joins. This module is the profile both share and
the fallback where that form does not work (no cgroups to find a command's processes,
Landlock too old to keep commands off the container's init).

Profile (research/sandbox.md §1 and Recommendation): every namespace unshared, a user
namespace in which the command is uid/gid 1000 with no capabilities and no nested user
namespaces, a new session (no TIOCSTI into a terminal), an environment built from the
allowlist only. The filesystem is a read-only root with `/usr`, the `/bin`-style links and a
few `/etc` files read-only, a generated `/etc/passwd`, a private tmpfs `/tmp`, and the
workspace read-write at `/workspace`. Network is the container's own namespace with
loopback only; a container never shares the host's. A command with network reaches the
outside only through Cairn's egress proxy (`egress/`): bwrap reports its sandbox's pid
(`--info-fd`) and holds the command (`--block-fd`) until the proxy's listener is open in the
sandbox's namespace (`egress/netns.py`); the command gets the proxy variables and trusts
Cairn's CA (`egress/trust.py`, files copied in like the /etc ones).

When the server is root, bwrap itself is launched as the dedicated unprivileged host
account (`_account.py`): run as root, bwrap keeps every capability inside and a read-only
bind can be remounted writable onto host files. The pid namespace plus `--die-with-parent`
means no process of a command survives it, nor a crash of the server. The launcher
(`_launch.py`, the fork server's child) joins the command's cgroups, sets its rlimits and
drops to that account, then execs bwrap.

The /etc allowlist's directories are bound read-only; its files, and the generated passwd,
group and hosts, are handed to bwrap as descriptors (`--file`) that it copies into the
container's root before making it read-only. Each bind costs bwrap a mount, a remount and
a pass over /proc/self/mountinfo; the copies took 1.5-5 ms off every command's start on
the reference host (docs/sandbox.md). The launcher opens the host files afresh for each
command, as the sandbox account, so a command sees their current content, as with a bind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from cairn._concurrency import run_sync
from cairn.config import EgressSettings
from cairn.errors import SandboxError
from cairn.sandbox._account import SandboxAccount, resolve_sandbox_account
from cairn.sandbox._cgroups import discover_cgroups
from cairn.sandbox._containment import Containment
from cairn.sandbox._env import DEFAULT_PATH, ENV_ISOLATION, command_env
from cairn.sandbox._launch import Handoff, LaunchedBackend
from cairn.sandbox._launcher.spec import PASSED_FD
from cairn.sandbox._rootfs import (
    ETC_READ_ONLY,
    HOSTNAME,
    ROOTFS_ISOLATION,
    SANDBOX_HOME,
    SANDBOX_USER,
    generated_etc,
    system_layout,
)
from cairn.sandbox.base import WORKSPACE_MOUNT, ExecRequest
from cairn.sandbox.egress.ca import EgressCA
from cairn.sandbox.egress.netns import listen_in_namespace
from cairn.sandbox.egress.proxy import EgressProxy
from cairn.sandbox.egress.trust import CA_DIR, SYSTEM_BUNDLE, proxy_env, trust_files

__all__ = ["PER_COMMAND", "BwrapBackend", "bwrap_usage", "locate_bwrap", "workspace_argv"]

logger = logging.getLogger(__name__)

# The command's uid/gid inside bwrap's user namespace (mapped onto the host account).
SANDBOX_UID = 1000
# The descriptor numbers of the files handed to bwrap start here (0-2 are the command's).
_FIRST_FILE_FD = 10
PER_COMMAND = "a fresh bwrap container for each command"
_DOOR_TIMEOUT_S = 30.0


class BwrapBackend(LaunchedBackend):
    """Runs each command in its own bubblewrap container; see the module docstring."""

    name = "bwrap"
    capabilities = frozenset({"isolation", "workspace_mount", "process_isolation", "egress"})
    seccomp = False  # bwrap confines the command itself (and --disable-userns)

    def __init__(
        self,
        *,
        bwrap: str,
        account: SandboxAccount | None,
        containment: Containment,
        file_perms: bool = True,
    ) -> None:
        """`file_perms`: this bwrap knows `--perms` (0.5 and later), so copied files are 0444."""
        super().__init__(account=account, containment=containment)
        self._bwrap = bwrap
        self._fixed_argv, self._etc_files = _fixed_argv(bwrap, file_perms=file_perms)
        self._perms = ["--perms", "0444"] if file_perms else []
        # How containers are used, for `isolation`; `detect_bwrap` adds why not per session.
        self.containers = PER_COMMAND
        self._egress: EgressProxy | None = None
        self._egress_sessions: dict[str, str] = {}  # workspace -> session with network

    @classmethod
    def detect(cls) -> BwrapBackend:
        """Build the per-command backend for this host and prove it works by running `true`.

        Raises `SandboxError` saying why bwrap cannot isolate here (not installed, user
        namespaces disabled, ...). Blocking: call at startup or through `run_sync`.
        """
        bwrap = locate_bwrap()
        account = resolve_sandbox_account()
        backend = cls(
            bwrap=bwrap,
            file_perms=b"--perms" in bwrap_usage(bwrap),
            account=account,
            containment=Containment(
                cgroups=discover_cgroups(), nproc_counts=account is not None, pid_namespace=True
            ),
        )
        with tempfile.TemporaryDirectory(prefix="cairn-bwrap-probe-") as probe:
            backend._probe(Path(probe), None)
        return backend

    def use_egress(self, proxy: EgressProxy) -> None:
        self._egress = proxy

    @property
    def egress(self) -> EgressProxy:
        """The proxy sandboxes with network go through: the operator's (`use_egress`), or
        one with default settings and a CA in memory, made on first use."""
        if self._egress is None:
            self._egress = EgressProxy(EgressSettings(), EgressCA.ephemeral())
        return self._egress

    def _admit(self, request: ExecRequest) -> None:
        """Tell the proxy the session's current policy and credentials, before any command
        of it can connect."""
        assert request.egress is not None
        self.egress.admit(request.egress)
        self._egress_sessions[str(request.workspace)] = request.egress.session_id

    async def release_workspace(self, workspace: Path) -> None:
        session_id = self._egress_sessions.pop(str(workspace), None)
        if session_id is not None:
            self.egress.forget(session_id)

    @property
    def isolation(self) -> Mapping[str, str]:
        owner = (
            self._account.describe()
            if self._account is not None
            else f"the server's own user (uid {os.geteuid()})"
        )
        return {
            "backend": f"bwrap ({self._bwrap})",
            "containers": self.containers,
            **ROOTFS_ISOLATION,
            "privileges": (
                f"uid/gid {SANDBOX_UID} inside, no capabilities, no nested user namespaces, "
                "new session"
            ),
            "host_user": owner,
            "environment": ENV_ISOLATION,
            "network": (
                "own network namespace per container, loopback only; a session with network reaches "
                "the outside only through Cairn's egress proxy (a program ignoring it reaches nothing)"
            ),
            "egress": self.egress.description,
        }

    def _command(
        self, request: ExecRequest, scratch: Path | None
    ) -> tuple[list[str], dict[str, str], str]:
        env = self._command_env(request)
        argv = [*self._fixed_argv, "--tmpfs", "/tmp"]
        if request.network:
            argv += [*self._trust_argv()[0], "--info-fd", str(PASSED_FD), "--block-fd", str(PASSED_FD + 1)]
        argv += workspace_argv(request.workspace)
        for name, value in env.items():
            argv += ["--setenv", name, value]
        argv += ["--", "/bin/sh", "-c", request.command]
        # bwrap's pid 1 inside keeps this environment (readable in /proc/1/environ there),
        # so it is minimal, and it starts in `/`, not in the server's working directory.
        return argv, {"PATH": DEFAULT_PATH}, "/"

    def _command_env(self, request: ExecRequest) -> dict[str, str]:
        """A command's environment: with network, the proxy's variables under the session's."""
        session_env = {**proxy_env(), **request.env} if request.network else request.env
        return command_env(home=SANDBOX_HOME, user=SANDBOX_USER, session_env=session_env)

    def _files(self, request: ExecRequest) -> list[tuple[int, str | bytes]]:
        return [*self._etc_files, *(self._trust_argv()[1] if request.network else [])]

    def _trust_argv(self) -> tuple[list[str], list[tuple[int, str | bytes]]]:
        """The bwrap options and files that make a container trust Cairn's CA (blocking:
        reads the host's bundle). Its files come after the /etc ones."""
        files, system_bundle = trust_files(self.egress.ca)
        number = max((fd for fd, _ in self._etc_files), default=_FIRST_FILE_FD - 1) + 1
        argv = ["--dir", CA_DIR]
        handed: list[tuple[int, str | bytes]] = []
        for path, content in files.items():
            argv += [*self._perms, "--file", str(number + len(handed)), path]
            handed.append((number + len(handed), content))
        if system_bundle is not None:
            argv += ["--ro-bind-data", str(number + len(handed)), SYSTEM_BUNDLE]
            handed.append((number + len(handed), system_bundle))
        return argv, handed

    @asynccontextmanager
    async def _handoff(self, request: ExecRequest) -> AsyncIterator[Handoff | None]:
        """For a command with network: bwrap's info and block descriptors, and, once it
        started, the proxy's door into its sandbox (closed when the command ends)."""
        if request.egress is None:
            yield None
            return
        self._admit(request)
        session_id = request.egress.session_id
        info, info_theirs = socket.socketpair()
        block, block_theirs = socket.socketpair()
        closers: list[Callable[[], None]] = []

        async def started() -> None:
            info_theirs.close()  # the fork server has its own copies by now
            block_theirs.close()
            close_door = await run_sync(self._open_door, info, session_id)
            if close_door is None:
                return  # bwrap ended without a sandbox: supervising it reports why
            closers.append(close_door)
            try:
                block.send(b"go")
            except BrokenPipeError as exc:
                raise SandboxError("the sandbox ended before its command could start") from exc

        try:
            yield Handoff((info_theirs.fileno(), block_theirs.fileno()), started)
        finally:
            for close_door in closers:
                close_door()
            for end in (info, info_theirs, block, block_theirs):
                end.close()

    def _open_door(self, info: socket.socket, session_id: str) -> Callable[[], None] | None:
        """The proxy's listener in the sandbox bwrap reports on `info`, served as
        `session_id`'s; None if bwrap ended without a sandbox (its output says why).
        Blocking: bwrap reports once the sandbox exists, and holds the command meanwhile."""
        info.settimeout(_DOOR_TIMEOUT_S)
        report = b""
        try:
            while b"}" not in report:
                chunk = info.recv(4096)
                if not chunk:
                    return None
                report += chunk
        except TimeoutError as exc:
            raise SandboxError("bwrap did not report its sandbox in time") from exc
        try:
            pid = int(json.loads(report)["child-pid"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SandboxError(f"bwrap did not report its sandbox's pid: {report!r}") from exc
        # The sandbox's first process waits on the block descriptor: it is alive, so its
        # pid is still its own when the pidfd is opened.
        pidfd = os.pidfd_open(pid)
        try:
            return self.egress.serve(listen_in_namespace(pidfd), session_id)
        finally:
            os.close(pidfd)


def locate_bwrap() -> str:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxError("bubblewrap is not installed (apt-get install bubblewrap)")
    return bwrap


def bwrap_usage(bwrap: str) -> bytes:
    """`bwrap --help`, to tell which options this version knows; empty if it cannot run
    (the probe that follows says what is wrong with it)."""
    try:
        return subprocess.run(
            [bwrap, "--help"], capture_output=True, check=False, timeout=10, env={}
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return b""


def workspace_argv(workspace: Path) -> list[str]:
    """The workspace at /workspace and the read-only root: the last part of a container's
    filesystem, after its tmpfs mounts and any files added to it."""
    return [
        "--bind", str(workspace), WORKSPACE_MOUNT,
        # Last mount op: all but /workspace and the tmpfs mounts becomes read-only.
        "--remount-ro", "/", "--chdir", WORKSPACE_MOUNT,
    ]


def _fixed_argv(
    bwrap: str, *, file_perms: bool
) -> tuple[list[str], list[tuple[int, str | bytes]]]:
    """The part of the bwrap command line that is the same for every container up to its
    tmpfs mounts, and the files it copies in (`--file <fd>`: descriptor number, host path
    or content). Without `--perms` a copy's mode follows the umask; the root is read-only
    either way."""
    perms = ["--perms", "0444"] if file_perms else []
    argv = [
        bwrap, "--unshare-all",
        "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
        "--cap-drop", "ALL", "--disable-userns", "--die-with-parent", "--new-session",
        "--clearenv", "--hostname", HOSTNAME,
    ]
    layout = system_layout()
    for path in layout.read_only:
        argv += ["--ro-bind", path, path]
    for target, path in layout.symlinks:
        argv += ["--symlink", target, path]
    files: list[tuple[int, str | bytes]] = []
    for name in ETC_READ_ONLY:
        path = f"/etc/{name}"
        if os.path.isdir(path):
            argv += ["--ro-bind-try", path, path]
        elif os.path.exists(path):  # a file, or a link to one (copied: a bind follows it too)
            files.append((_FIRST_FILE_FD + len(files), path))
            argv += [*perms, "--file", str(files[-1][0]), path]
    for name, content in generated_etc(SANDBOX_UID, SANDBOX_UID).items():
        files.append((_FIRST_FILE_FD + len(files), content.encode()))
        argv += [*perms, "--file", str(files[-1][0]), f"/etc/{name}"]
    return argv + ["--proc", "/proc", "--dev", "/dev"], files
