"""The filesystem a namespaced command sees, shared by the bwrap and namespaces backends.

Both build the same view: read-only /usr, the merged-/usr links (or read-only binds where
/bin, /lib... are real directories), a read-only allowlist of /etc entries that toolchains
expect, generated /etc/passwd, group and hosts naming the command's user `sandbox`, and a
minimal /dev. Nothing else of the host exists inside.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEVICES",
    "ETC_READ_ONLY",
    "HOSTNAME",
    "ROOTFS_ISOLATION",
    "SANDBOX_HOME",
    "SANDBOX_USER",
    "SystemLayout",
    "generated_etc",
    "system_layout",
]

SANDBOX_USER = "sandbox"
SANDBOX_HOME = "/tmp"
HOSTNAME = "sandbox"

# Read-only views of host configuration every toolchain expects; absent ones are skipped.
ETC_READ_ONLY = (
    "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl", "ca-certificates",
    "localtime", "mime.types", "os-release", "nsswitch.conf", "host.conf", "gai.conf",
    "resolv.conf", "services", "protocols",
)
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


def generated_etc(uid: int, gid: int) -> dict[str, str]:
    """/etc/passwd, group and hosts for a command running as `uid`/`gid`."""
    return {
        "passwd": (
            "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
            f"{SANDBOX_USER}:x:{uid}:{gid}:Cairn sandbox:{SANDBOX_HOME}:/bin/sh\n"
            + ("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n" if uid != 65534 else "")
        ),
        "group": (
            f"root:x:0:\n{SANDBOX_USER}:x:{gid}:\n"
            + ("nogroup:x:65534:\n" if gid != 65534 else "")
        ),
        "hosts": f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n127.0.1.1\t{HOSTNAME}\n",
    }


@dataclass(frozen=True, slots=True)
class SystemLayout:
    """Host directories bound read-only at the same path, and links recreated as they are."""

    read_only: tuple[str, ...]
    symlinks: tuple[tuple[str, str], ...]  # (target, path)


def system_layout() -> SystemLayout:
    read_only = ["/usr"]
    symlinks: list[tuple[str, str]] = []
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / top
        if host.is_symlink():
            symlinks.append((os.readlink(host), str(host)))
        elif host.is_dir():
            read_only.append(str(host))
    return SystemLayout(read_only=tuple(read_only), symlinks=tuple(symlinks))


# How the backends that build this root filesystem in fresh namespaces describe it (`isolation`).
ROOTFS_ISOLATION = {
    "filesystem": (
        "only the workspace (read-write at /workspace) and a private /tmp are writable; /usr and "
        "selected /etc files are read-only; the rest of the host filesystem is absent"
    ),
    "network": (
        "own network namespace with loopback only; commands of sessions that enable network are "
        "refused (network goes through Cairn's egress proxy, which needs bwrap)"
    ),
    "processes": "own pid, ipc, uts and cgroup namespaces; host processes are invisible",
}
