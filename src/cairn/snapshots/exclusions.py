"""Which workspace paths a snapshot leaves out, and a restore leaves in place.

Two kinds: *ephemeral* paths (caches, build output the deployment declares throwaway) and
*mount targets* registered at runtime, where the sandbox binds something that is not the
session's to snapshot. Both are skipped by a persist and by the fingerprint, and survive the
"clear the workspace" step of a restore untouched. An ephemeral exclusion that overlaps a
mount target (equal, inside it, or containing it) is rejected: it would either hide the mount
from its own bookkeeping or claim a path that the mount owns.

Paths are relative to the workspace root; `/workspace/...` (the sandbox's view) is accepted.
"""

from __future__ import annotations

from collections.abc import Iterable

from cairn.snapshots.errors import InvalidExclusionError
from cairn.workspace import WORKSPACE_MOUNT

__all__ = ["Exclusions", "normalize_relative_path"]


def normalize_relative_path(path: str) -> str:
    """`a/b` for `a/b`, `./a//b/`, or `/workspace/a/b`; rejects escapes and other absolute paths."""
    if path.startswith(f"{WORKSPACE_MOUNT}/"):
        path = path[len(WORKSPACE_MOUNT) + 1 :]
    elif path.startswith("/"):
        raise InvalidExclusionError(f"exclusion {path!r} is outside {WORKSPACE_MOUNT}", param="path")
    parts = [part for part in path.split("/") if part not in {"", "."}]
    if not parts or ".." in parts or "\0" in path:
        raise InvalidExclusionError(
            f"exclusion {path!r} must name a path inside the workspace", param="path"
        )
    return "/".join(parts)


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(f"{b}/") or b.startswith(f"{a}/")


class Exclusions:
    """A mutable set of excluded paths owned by one workspace lifecycle."""

    def __init__(self, ephemeral: Iterable[str] = (), mounts: Iterable[str] = ()) -> None:
        self._ephemeral: set[str] = set()
        self._mounts: set[str] = set()
        for path in mounts:
            self.add_mount(path)
        for path in ephemeral:
            self.add_ephemeral(path)

    def add_ephemeral(self, path: str) -> None:
        normalized = normalize_relative_path(path)
        for mount in self._mounts:
            if _overlaps(normalized, mount):
                raise InvalidExclusionError(
                    f"exclusion {normalized!r} overlaps the mount target {mount!r}", param="path"
                )
        self._ephemeral.add(normalized)

    def add_mount(self, path: str) -> None:
        normalized = normalize_relative_path(path)
        for ephemeral in self._ephemeral:
            if _overlaps(normalized, ephemeral):
                raise InvalidExclusionError(
                    f"mount target {normalized!r} overlaps the exclusion {ephemeral!r}", param="path"
                )
        self._mounts.add(normalized)

    def remove_mount(self, path: str) -> None:
        self._mounts.discard(normalize_relative_path(path))

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(self._ephemeral | self._mounts)

    def is_excluded(self, relative_path: str) -> bool:
        """True for an excluded path and for anything below one."""
        return any(
            relative_path == path or relative_path.startswith(f"{path}/")
            for path in (*self._ephemeral, *self._mounts)
        )
