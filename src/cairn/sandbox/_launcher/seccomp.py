"""A seccomp denylist for sandboxed commands, built with libseccomp through ctypes.

What it closes (research/sandbox.md §4): new namespaces (`unshare`, `setns`, `clone` with
CLONE_NEWUSER; `clone3`, whose flags a filter cannot read, answers ENOSYS so libc falls
back to `clone`), mounts, ptrace, BPF, keyrings, kernel modules, io_uring (whose socket and
connect operations bypass the socket filter), and — when the command has no network —
every socket that is not AF_UNIX, which is what confines UDP and raw sockets where Landlock
only covers TCP. libseccomp maps names to this architecture's numbers and kills a process
that calls in through a foreign ABI (e.g. i386 `int 0x80`), so the filter cannot be
side-stepped that way.
"""

from __future__ import annotations

import ctypes
import errno
import os

__all__ = ["install_filter"]

_ALLOW = 0x7FFF0000
_CMP_NE = 1
_CMP_MASKED_EQ = 7
_CLONE_NEWUSER = 0x10000000
_AF_UNIX = 1

_DENIED = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "mount_setattr",
    "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    "ptrace", "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open",
    "userfaultfd", "keyctl", "add_key", "request_key", "init_module", "finit_module",
    "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff",
    "open_by_handle_at", "name_to_handle_at", "acct", "quotactl", "syslog",
)
_ABSENT = ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register")


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


def install_filter(*, deny_network: bool) -> None:
    """Load the filter into this process; it is inherited by everything it execs or forks."""
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError as exc:
        raise OSError(f"libseccomp is not installed (Debian: libseccomp2): {exc}") from exc
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp)
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")
    try:

        def rule(name: str, action: int, *comparisons: _ArgCmp) -> None:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                return  # not a system call on this architecture: nothing to deny
            array = (_ArgCmp * max(len(comparisons), 1))(*comparisons)
            result = lib.seccomp_rule_add_array(ctx, action, number, len(comparisons), array)
            if result < 0:
                raise OSError(-result, f"seccomp rule for {name}: {os.strerror(-result)}")

        for name in _DENIED:
            rule(name, _errno_action(errno.EPERM))
        for name in _ABSENT:
            rule(name, _errno_action(errno.ENOSYS))
        rule("clone", _errno_action(errno.EPERM),
             _ArgCmp(0, _CMP_MASKED_EQ, _CLONE_NEWUSER, _CLONE_NEWUSER))
        if deny_network:
            rule("socket", _errno_action(errno.EPERM), _ArgCmp(0, _CMP_NE, _AF_UNIX, 0))
        result = lib.seccomp_load(ctx)
        if result < 0:
            raise OSError(-result, f"seccomp_load: {os.strerror(-result)}")
    finally:
        lib.seccomp_release(ctx)
