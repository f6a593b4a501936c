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

    class Join(TypedDict):
        """Join a running container (bwrap session containers) instead of creating one.

        The container's init arrives as a pidfd at `PASSED_FD`, and the fork server forked
        the launcher into its pid namespace; the command then runs in the container's
        user, mount, uts and net namespaces too, with a fresh ipc and cgroup namespace of
        its own, as `LaunchSpec.user` of the container's user namespace, in a Landlock
        domain scoped to the command (ABI `landlock_abi`).
        """

        landlock_abi: int

    class LaunchSpec(TypedDict):
        argv: list[str]
        env: dict[str, str]
        cwd: str  # as the command sees it (after any pivot_root)
        workspace: str  # host path
        cgroup_join: list[str]  # v1 `tasks` / v2 `cgroup.procs` files to write "0" to
        rlimits: list[tuple[int, int]]  # (resource.RLIMIT_*, soft = hard value)
        # (uid, gid) to become (inside the container's user namespace when joining one);
        # None keeps the caller's
        user: tuple[int, int] | None
        network: bool
        seccomp: bool  # install the seccomp denylist (not for bwrap: it has its own)
        # Descriptors the exec'd program inherits, by number: a host path (opened read-only
        # as the command's user) or content (in a memfd); bwrap copies them into its root.
        files: list[tuple[int, str | bytes]]
        rootfs: Rootfs | None
        landlock: Landlock | None
        join: Join | None

__all__ = ["PASSED_FD", "WORKSPACE"]

WORKSPACE = "/workspace"
# The descriptor number at which a request's optional extra descriptor reaches the launcher
# (the spec's memfd is 3 until loaded): a container's pidfd to join, or the pipe bwrap
# writes its container's pid to (`--info-fd`).
PASSED_FD = 4
