"""Builds the command's root filesystem in a new mount namespace, then pivots into it.

The same view bwrap gives (research/sandbox.md §2, done with syscalls instead of ~20
mount(8) runs): a read-only tmpfs root holding read-only binds of /usr and selected /etc
entries, the merged-/usr links, generated /etc files, a fresh /proc of the command's pid
namespace, a minimal /dev, private tmpfs /tmp and /dev/shm, and the workspace read-write
at /workspace. Every mount is nosuid and nodev. The tmpfs is mounted on `root_dir`, an
empty private host directory the backend made, which shadows no bind source, so no second
pivot is needed; all of
this is private to the namespace and vanishes with it.
"""

from __future__ import annotations

import os

from .spec import WORKSPACE
from .syscalls import mount, pivot_root, sethostname, umount2

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .spec import Rootfs

__all__ = ["enter_rootfs"]

_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2
_SAFE = _MS_NOSUID | _MS_NODEV


def enter_rootfs(rootfs: Rootfs, workspace: str) -> None:
    """Make `rootfs` (with `workspace` at /workspace) this mount namespace's `/`."""
    mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    root = rootfs["root_dir"]
    mount("tmpfs", root, "tmpfs", _SAFE, "mode=0755,size=4m")
    for path in rootfs["read_only"]:
        _bind(path, root + path, flags=_SAFE | _MS_RDONLY)
    for target, path in rootfs["symlinks"]:
        os.symlink(target, root + path)
    os.makedirs(root + "/etc", exist_ok=True)
    for name, content in rootfs["etc_files"].items():
        with open(f"{root}/etc/{name}", "w") as generated:
            generated.write(content)
    _mount_dev(root, rootfs["devices"])
    os.mkdir(root + "/tmp")
    os.mkdir(root + "/proc")
    mount("tmpfs", root + "/tmp", "tmpfs", _SAFE, "mode=1777")
    mount("proc", root + "/proc", "proc", _SAFE | _MS_NOEXEC)
    _bind(workspace, root + WORKSPACE, flags=_SAFE)
    mount(None, root, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _SAFE)
    os.chdir(root)
    pivot_root(".", ".")  # the old root now sits on top of the new one ...
    umount2(".", _MNT_DETACH)  # ... and is detached, leaving the new root alone
    os.chdir("/")
    sethostname(rootfs["hostname"])


def _bind(source: str, target: str, *, flags: int) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "x").close()
    mount(source, target, None, _MS_BIND | _MS_REC)
    # Bind mounts ignore flags on creation; a remount applies them.
    mount(None, target, None, _MS_REMOUNT | _MS_BIND | flags)


def _mount_dev(root: str, devices: list[str]) -> None:
    dev = root + "/dev"
    os.mkdir(dev)
    mount("tmpfs", dev, "tmpfs", _SAFE | _MS_NOEXEC, "mode=0755,size=64k")
    for device in devices:
        _bind(device, root + device, flags=_MS_NOSUID | _MS_NOEXEC)  # nodev would disable it
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(dev + "/shm")
    mount("tmpfs", dev + "/shm", "tmpfs", _SAFE, "mode=1777")
