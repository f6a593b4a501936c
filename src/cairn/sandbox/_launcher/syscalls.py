"""The raw Linux system calls the launcher needs, each raising `OSError` on failure.

Python 3.11's `os` has no `mount`, `unshare`, `setns`, `pivot_root`, `prctl`, `capset`,
Landlock or mount-API (`fspick`, `fsconfig`) calls, so they go through libc with ctypes. Syscall numbers that libc has no wrapper for
differ per architecture; an unknown architecture is an error, never a guess.
"""

from __future__ import annotations

import ctypes
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "call",
    "capset_zero",
    "reconfigure_mount",
    "mount",
    "pivot_root",
    "prctl",
    "sethostname",
    "setns",
    "syscall",
    "umount2",
    "unshare",
]

_LIBC = ctypes.CDLL(None, use_errno=True)

# Numbers libc has no wrapper for. Landlock's are the same on every architecture.
_NUMBERS = {
    "x86_64": {"pivot_root": 155, "capset": 126},
    "aarch64": {"pivot_root": 41, "capset": 91},
}
LANDLOCK_CREATE_RULESET = 444
LANDLOCK_ADD_RULE = 445
LANDLOCK_RESTRICT_SELF = 446
# The mount API's are too (both architectures use the common table for calls >= 424).
_FSCONFIG = 431
_FSPICK = 433
_FSCONFIG_SET_STRING = 1
_FSCONFIG_CMD_RECONFIGURE = 7
_AT_FDCWD = -100


def _number(name: str) -> int:
    machine = os.uname().machine
    if machine not in _NUMBERS:
        raise OSError(f"the sandbox launcher does not know system call numbers for {machine}")
    return _NUMBERS[machine][name]


def call(result: int, what: str) -> int:
    """Return `result`, or raise `OSError` with errno when a libc call returned -1."""
    if result == -1:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")
    return result


def syscall(number: int, *args: object, what: str) -> int:
    return call(_LIBC.syscall(ctypes.c_long(number), *args), what)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    call(
        _LIBC.mount(
            None if source is None else source.encode(),
            target.encode(),
            None if fstype is None else fstype.encode(),
            ctypes.c_ulong(flags),
            None if data is None else data.encode(),
        ),
        f"mount {source} on {target}",
    )


def umount2(target: str, flags: int) -> None:
    call(_LIBC.umount2(target.encode(), ctypes.c_int(flags)), f"umount {target}")


def unshare(flags: int) -> None:
    call(_LIBC.unshare(ctypes.c_int(flags)), "unshare")


def setns(fd: int, flags: int) -> None:
    call(_LIBC.setns(ctypes.c_int(fd), ctypes.c_int(flags)), "setns")


def reconfigure_mount(path: str, options: dict[str, str], *, before: Callable[[], None]) -> None:
    """Set `options` on the file system mounted at `path` (its root), calling `before` once
    the mount is picked and before anything changes (a last check that it is the right one).

    `fspick` reaches a mount of another mount namespace through a path such as
    /proc/<pid>/root/..., which `mount(MS_REMOUNT)` refuses.
    """
    fd = syscall(_FSPICK, ctypes.c_int(_AT_FDCWD), path.encode(), ctypes.c_uint(0), what=f"fspick {path}")
    try:
        before()
        for key, value in options.items():
            syscall(_FSCONFIG, ctypes.c_int(fd), ctypes.c_uint(_FSCONFIG_SET_STRING), key.encode(),
                    value.encode(), ctypes.c_int(0), what=f"fsconfig {key}={value}")
        syscall(_FSCONFIG, ctypes.c_int(fd), ctypes.c_uint(_FSCONFIG_CMD_RECONFIGURE), None, None,
                ctypes.c_int(0), what=f"reconfigure {path}")
    finally:
        os.close(fd)


def pivot_root(new_root: str, put_old: str) -> None:
    syscall(_number("pivot_root"), new_root.encode(), put_old.encode(), what="pivot_root")


def sethostname(name: str) -> None:
    encoded = name.encode()
    call(_LIBC.sethostname(encoded, ctypes.c_size_t(len(encoded))), "sethostname")


def prctl(option: int, arg2: int = 0, arg3: int = 0) -> int:
    return call(
        _LIBC.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3),
                    ctypes.c_ulong(0), ctypes.c_ulong(0)),
        f"prctl {option}",
    )


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def capset_zero() -> None:
    """Clear the effective, permitted and inheritable capability sets of this thread."""
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two data words
    data = (_CapData * 2)()
    syscall(_number("capset"), ctypes.byref(header), data, what="capset")
