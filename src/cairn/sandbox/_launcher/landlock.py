"""Landlock: confine this process's file access, TCP and signals to an allowlist.

Every file-system right the running kernel's ABI knows is "handled" (denied unless a rule
grants it beneath a path); TCP bind and connect are handled with no rule when the command
has no network (ABI >= 4), and signals plus abstract unix sockets are scoped to the
command's own domain (ABI >= 6). A domain cannot be loosened, is inherited across fork and
exec, and each command gets a new one, so commands cannot reach each other either.
`scope_self` is the scope alone, for commands that join a bwrap session container.
"""

from __future__ import annotations

import ctypes
import os
import stat

from .syscalls import (
    LANDLOCK_ADD_RULE,
    LANDLOCK_CREATE_RULESET,
    LANDLOCK_RESTRICT_SELF,
    syscall,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["SCOPING_ABI", "abi_version", "restrict_self", "scope_self"]

_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

_EXECUTE = 1 << 0
_WRITE_FILE = 1 << 1
_READ_FILE = 1 << 2
_READ_DIR = 1 << 3
_TRUNCATE = 1 << 14
_IOCTL_DEV = 1 << 15
# Rights that only make sense on a file (a file rule with directory rights is EINVAL).
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_NET_BIND_TCP = 1 << 0
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
_SCOPE_SIGNAL = 1 << 1
SCOPING_ABI = 6  # the first ABI with `scoped`

READ_ONLY = _EXECUTE | _READ_FILE | _READ_DIR
# A device node such as /dev/null: read, write, `> /dev/null` (O_TRUNC) and tty ioctls.
DEVICE = _READ_FILE | _WRITE_FILE | _TRUNCATE | _IOCTL_DEV


def _fs_rights(abi: int) -> int:
    """Every file-system right ABI `abi` defines: bits 0-12, then one more per ABI 2, 3, 5."""
    rights = (1 << 13) - 1
    for bit, since in ((13, 2), (14, 3), (15, 5)):
        if abi >= since:
            rights |= 1 << bit
    return rights


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi_version() -> int:
    """The running kernel's Landlock ABI version, or 0 when Landlock is off or absent."""
    try:
        return syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                       ctypes.c_uint32(_CREATE_RULESET_VERSION), what="landlock ABI")
    except OSError:
        return 0


def restrict_self(
    *, abi: int, read_write: Iterable[str], read_only: Iterable[str], devices: Iterable[str],
    confine_tcp: bool,
) -> None:
    """Allow only the given paths (and, unless `confine_tcp` is False, no TCP).

    The caller must have set no_new_privs first (or hold CAP_SYS_ADMIN).
    """
    handled_fs = _fs_rights(abi)
    attr = _RulesetAttr(handled_fs, 0, 0)
    size = 8  # ABI 1-3 know only handled_access_fs
    if confine_tcp:
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP
        size = 16
    if abi >= SCOPING_ABI:
        attr.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
        size = 24
    ruleset = syscall(LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                      ctypes.c_uint32(0), what="landlock_create_ruleset")
    try:
        grants = [(path, handled_fs) for path in read_write]
        grants += [(path, READ_ONLY) for path in read_only]
        grants += [(path, DEVICE) for path in devices]
        for path, rights in grants:
            _add_path_rule(ruleset, path, rights & handled_fs)
        syscall(LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0),
                what="landlock_restrict_self")
    finally:
        os.close(ruleset)


def scope_self(abi: int) -> None:
    """Enter a domain of this process's own that restricts nothing on the file system or
    network: processes outside it cannot be traced (ptrace, /proc/<pid>/mem, environ, fd),
    signalled, or reached through abstract unix sockets from inside it.

    Landlock has always confined ptrace to a tracer's own domain and those nested in it;
    `scoped` (ABI >= 6) adds signals and abstract sockets. No file-system right is handled,
    so nothing else changes (a domain that handles one also denies renames across
    directories). The caller must have set no_new_privs first.
    """
    if abi < SCOPING_ABI:
        raise OSError(f"Landlock ABI {abi} cannot scope signals (need >= {SCOPING_ABI})")
    attr = _RulesetAttr(0, 0, _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL)
    ruleset = syscall(LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(24),
                      ctypes.c_uint32(0), what="landlock_create_ruleset")
    try:
        syscall(LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0),
                what="landlock_restrict_self")
    finally:
        os.close(ruleset)


def _add_path_rule(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # an optional path (say /etc/gai.conf) this host does not have
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS
        rule = _PathBeneathAttr(rights, fd)
        syscall(LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                ctypes.byref(rule), ctypes.c_uint32(0), what=f"landlock rule for {path}")
    finally:
        os.close(fd)
