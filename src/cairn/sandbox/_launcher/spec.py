"""What the server tells the launcher to do for one command, as plain marshal-able data.

`marshal` rather than JSON: it is built in, so the launcher starts without importing `json`
and `re` (7 ms of a ~15 ms start); server and launcher are the same interpreter, so its
version-specific format is never a concern. The types exist for mypy only (importing
`typing` would cost the launcher the same again).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypedDict

    class Rootfs(TypedDict):
        """A fresh root (namespaces backend): tmpfs at `root_dir`, binds, generated /etc."""

        root_dir: str
        hostname: str
        read_only: list[str]  # host paths bound read-only at the same path
        symlinks: list[tuple[str, str]]  # (target, path), e.g. ("usr/bin", "/bin")
        etc_files: dict[str, str]  # generated /etc/<name> contents
        devices: list[str]  # host device nodes bound read-write, e.g. /dev/null

    class Landlock(TypedDict):
        """An allowlist for the host's own filesystem (landlock backend)."""

        abi: int
        read_write: list[str]
        read_only: list[str]
        devices: list[str]

    class LaunchSpec(TypedDict):
        argv: list[str]
        env: dict[str, str]
        cwd: str  # as the command sees it (after any pivot_root)
        workspace: str  # host path
        cgroup_join: list[str]  # v1 `tasks` / v2 `cgroup.procs` files to write "0" to
        rlimits: list[tuple[int, int]]  # (resource.RLIMIT_*, soft = hard value)
        user: tuple[int, int] | None  # (uid, gid) to become; None keeps the caller's
        network: bool
        seccomp: bool  # install the seccomp denylist (not for bwrap: it has its own)
        # Descriptors the exec'd program inherits, by number: a host path (opened read-only
        # as the command's user) or content (in a memfd); bwrap copies them into its root.
        files: list[tuple[int, str | bytes]]
        rootfs: Rootfs | None
        landlock: Landlock | None

__all__ = ["WORKSPACE"]

WORKSPACE = "/workspace"
