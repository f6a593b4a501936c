"""What a forked command process does: confine itself as the spec says, then exec.

Steps, in an order that matters:
1. join the command's cgroups and set its rlimits, while still root and before anything
   else exists, so every process the command ever has is counted and limited;
2. `namespaces` mode: unshare mount, pid, ipc, uts, cgroup (and, without network, net)
   namespaces and fork; this process stays outside as the waiter and the child, pid 1 of
   the new pid namespace (so nothing survives it), builds and pivots into the new root;
   `join` mode (bwrap session containers): the fork server forked this process into a
   running container's pid namespace; enter its other namespaces (`_join_container`);
3. `landlock` mode: stays in the host's namespaces and restricts itself to an allowlist;
4. drop to the unprivileged user (no capabilities, no_new_privs), tie the child to its
   waiter (after the drop, which clears a parent-death signal), open the files the
   program is handed (as that user), restrict itself with Landlock (`landlock` rules, or
   `join`'s scope), install the seccomp filter, exec the command (`/bin/sh -c <command>`,
   or bwrap, which confines itself).

A failure before the exec prints one line to stderr (the command's output) and exits 125,
the status shells use for "could not run"; the backend turns that into a `SandboxError`.
"""

from __future__ import annotations

import os
import resource
import stat
import sys

from . import landlock, loopback, mounts, privileges, seccomp
from .spec import PASSED_FD
from .syscalls import prctl, setns, unshare

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .spec import LaunchSpec

__all__ = ["LAUNCH_FAILED", "run"]

LAUNCH_FAILED = 125
_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_PR_SET_PDEATHSIG = 1
_SIGKILL = 9  # not signal.SIGKILL: the `signal` module imports `enum` (slow to start)


def run(spec: LaunchSpec) -> None:
    """Confine this process as `spec` says and exec the command; never returns."""
    try:
        _contain(spec)
        waiter_alive = None
        if spec["join"] is not None:
            _join_container()
        elif spec["rootfs"] is not None:
            waiter_alive = _enter_namespaces(spec)
        _confine_and_exec(spec, waiter_alive)
    except Exception as exc:  # noqa: BLE001 - any failure before exec is "could not run"
        print(f"cairn sandbox launcher: {exc}", file=sys.stderr, flush=True)
        os._exit(LAUNCH_FAILED)


def _contain(spec: LaunchSpec) -> None:
    # "0" is the writer itself: this process, which is single-threaded, so joining through a
    # v1 `tasks` file moves all of it (and skips a global lock: `_cgroups.py`).
    for join in spec["cgroup_join"]:
        with open(join, "w") as joined:
            joined.write("0")
    for kind, value in spec["rlimits"]:
        resource.setrlimit(kind, (value, value))


def _enter_namespaces(spec: LaunchSpec) -> int:
    """Unshare and fork; only the child returns, as pid 1 inside the new root.

    Returns the descriptor that tells whether the waiter is alive (`_leash`).
    """
    flags = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS | _CLONE_NEWCGROUP
    if not spec["network"]:
        flags |= _CLONE_NEWNET
    unshare(flags)
    waiter_alive = _fork_waiter()
    rootfs = spec["rootfs"]
    assert rootfs is not None
    if not spec["network"]:
        loopback.bring_up_loopback()
    mounts.enter_rootfs(rootfs, spec["workspace"])
    return waiter_alive


def _join_container() -> None:
    """Enter the user, mount, uts and net namespaces of the container whose init's pidfd is
    `PASSED_FD` (the fork server forked this process into its pid namespace already).

    One `setns` through the pidfd enters them all at once: permission is checked with this
    process's host credentials before any of them takes effect (entering bwrap's nested
    user namespace first, one by one, would leave no right to enter the others). Entering
    the mount namespace sets the root and working directory to the container's root, so
    nothing of the host's tree is held. The ipc and cgroup namespaces are fresh, the
    command's own: SysV IPC and POSIX queues die with it instead of piling up in a
    long-lived container, and its cgroup leaves are its root. Until the privilege drop
    that follows, container processes cannot reach this one: it is another host uid, and
    outside their Landlock domains.
    """
    if os.geteuid() == 0:
        os.setgroups([])  # impossible inside: bwrap's user namespace denies setgroups
    setns(PASSED_FD, _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWUTS | _CLONE_NEWNET)
    os.close(PASSED_FD)
    unshare(_CLONE_NEWIPC | _CLONE_NEWCGROUP)


def _fork_waiter() -> int:
    """Fork: the parent waits and relays the child's status; only the child returns.

    The waiter holds the write end of a pipe until it exits, so EOF on the read end (which
    the child gets back) means it is gone.
    """
    alive_read, alive_write = os.pipe()
    child = os.fork()
    if child:
        _wait_and_exit(child)
    os.close(alive_write)
    return alive_read


def _leash(waiter_alive: int) -> None:
    """Die with the waiter: the server kills a command through it. Armed after the last
    credential change, which would clear it, and followed by a check that the waiter did
    not die before it was armed."""
    prctl(_PR_SET_PDEATHSIG, _SIGKILL)
    os.set_blocking(waiter_alive, False)
    try:
        os.read(waiter_alive, 1)
        os._exit(LAUNCH_FAILED)  # the waiter died before PDEATHSIG was armed
    except BlockingIOError:
        os.close(waiter_alive)


def _wait_and_exit(child: int) -> None:
    """Relay the child's status the way a shell reports it (128 + signal when killed)."""
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(128 - code if code < 0 else code)


def _confine_and_exec(spec: LaunchSpec, waiter_alive: int | None) -> None:
    rules, join = spec["landlock"], spec["join"]
    if spec["user"] is not None:
        privileges.drop_privileges(*spec["user"])
    else:
        privileges.set_no_new_privs()
    if waiter_alive is not None:
        _leash(waiter_alive)
    for number, source in spec["files"]:
        _hand_over(number, source)
    if rules is not None:
        landlock.restrict_self(
            abi=rules["abi"], read_write=rules["read_write"], read_only=rules["read_only"],
            devices=rules["devices"], confine_tcp=not spec["network"],
        )
    elif join is not None:
        # The container's init lives on after the command, outside its cgroups: a command
        # that could trace or signal it could leave a process behind (and kill the session's
        # other commands). The scope denies both, for every process outside its domain.
        landlock.scope_self(join["landlock_abi"])
    if spec["seccomp"]:
        seccomp.install_filter(deny_network=rules is not None and not spec["network"])
    os.chdir(spec["cwd"])
    if join is not None:
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # only stdin, stdout and stderr go in
    os.execve(spec["argv"][0], spec["argv"], spec["env"])


def _hand_over(number: int, source: str | bytes) -> None:
    """Make descriptor `number` (inherited across exec) read `source` from its start.

    A path is opened now, as the command's user, so the program sees the file's current
    content with the permissions a bind mount would give; one that is missing or not a
    regular file (a FIFO must not block the launch) reads as empty.
    """
    if isinstance(source, bytes):
        fd = os.memfd_create("cairn-file", 0)
        os.write(fd, source)
        os.lseek(fd, 0, os.SEEK_SET)
    else:
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = os.memfd_create("cairn-file", 0)
        else:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                fd = os.memfd_create("cairn-file", 0)
    if fd != number:
        os.dup2(fd, number)  # inheritable
        os.close(fd)
    else:
        os.set_inheritable(fd, True)
