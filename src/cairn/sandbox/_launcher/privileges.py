"""Become an unprivileged user for good: no capabilities now, none gainable later.

Order matters: the bounding set can only be shrunk while CAP_SETPCAP is held (so before the
uid switch); `setresuid` away from 0 clears the effective and permitted sets, but not the
inheritable one, which `capset_zero` clears; `no_new_privs` stops setuid binaries and file
capabilities from handing anything back at exec. The caller is either host root or root
that entered a container's user namespace (bwrap session containers), which holds every
capability there, a full bounding set again, and an unmapped uid (so not euid 0); it
dropped its supplementary groups before entering, as that namespace refuses setgroups.
"""

from __future__ import annotations

import os

from .syscalls import capset_zero, prctl

__all__ = ["drop_privileges", "set_no_new_privs"]

_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4


def set_no_new_privs() -> None:
    prctl(_PR_SET_NO_NEW_PRIVS, 1)


def drop_privileges(uid: int, gid: int) -> None:
    """Switch to `uid`/`gid` with no supplementary groups and an empty bounding set."""
    with open("/proc/sys/kernel/cap_last_cap", "rb") as last:
        cap_last = int(last.read())
    for cap in range(cap_last + 1):
        prctl(_PR_CAPBSET_DROP, cap)
    if os.geteuid() == 0:
        os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    capset_zero()
    set_no_new_privs()
