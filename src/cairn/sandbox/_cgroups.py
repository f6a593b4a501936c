"""Per-command cgroups: memory and process-count limits, and a handle to kill every member.

Found once per backend (`discover_cgroups`): a controller is used only where this host gives
a writable cgroup v1 hierarchy for it (research/sandbox.md §3: on the reference host v1
memory and pids are writable, while the v2 hierarchy delegates no controllers). Memory
cgroups nest under the server's own memory cgroup so the server's limit still covers its
commands. Each command gets fresh leaves, joined by the launcher before bwrap starts, so
every process the command creates is counted and can be found and killed.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from cairn.errors import SandboxError
from cairn.sandbox._kill import sigkill
from cairn.sandbox.base import ResourceLimits

__all__ = ["CgroupHost", "CommandCgroup", "discover_cgroups"]

logger = logging.getLogger(__name__)

_ROOT = Path("/sys/fs/cgroup")
# The file whose presence proves a controller's v1 hierarchy is mounted there.
_PROBES = {"memory": "memory.limit_in_bytes", "pids": "pids.max"}
_KILL_PATIENCE_S = 10.0
_KILL_PAUSE_S = 0.002
_REMOVE_ATTEMPTS = 40
_REMOVE_PAUSE_S = 0.005


@dataclass(frozen=True, slots=True)
class CgroupHost:
    """Where per-command cgroups are created, per controller, and why others are unused."""

    parents: dict[str, Path]
    unavailable: dict[str, str]

    def describe(self) -> str:
        parts = [f"v1 {name} under {parent}" for name, parent in sorted(self.parents.items())]
        parts += [f"{name} unused: {why}" for name, why in sorted(self.unavailable.items())]
        return "; ".join(parts) or "none"

    @property
    def has_memory(self) -> bool:
        return "memory" in self.parents

    @property
    def has_pids(self) -> bool:
        return "pids" in self.parents


def discover_cgroups(cgroup_file: Path = Path("/proc/self/cgroup")) -> CgroupHost:
    """Find writable v1 `memory` and `pids` hierarchies by creating a probe cgroup in each."""
    own = _own_paths(cgroup_file.read_text())
    parents: dict[str, Path] = {}
    unavailable: dict[str, str] = {}
    for controller, probe in _PROBES.items():
        mount = _ROOT / controller
        if controller not in own or not (mount / "cgroup.procs").exists():
            unavailable[controller] = f"no cgroup v1 {controller} hierarchy at {mount}"
            continue
        parent = mount / own[controller].lstrip("/") / "cairn"
        probe_leaf = parent / f"probe-{uuid.uuid4().hex[:8]}"
        try:
            parent.mkdir(exist_ok=True)
            probe_leaf.mkdir()
            # The root cgroup has no limit files, so look for them in a child.
            is_controller = (probe_leaf / probe).exists()
            probe_leaf.rmdir()
        except OSError as exc:
            unavailable[controller] = f"cgroup v1 {controller} at {parent} is not writable: {exc}"
            continue
        if not is_controller:
            unavailable[controller] = f"{mount} is not a cgroup v1 {controller} hierarchy"
            continue
        parents[controller] = parent
        _remove_stale_leaves_best_effort(parent)
    return CgroupHost(parents=parents, unavailable=unavailable)


def _remove_stale_leaves_best_effort(parent: Path) -> None:
    """Remove leaves left by a server that died (e.g. SIGKILL) before cleaning up.

    Their processes died with it (bwrap's --die-with-parent), so the leaves are empty. A leaf
    whose server pid is alive is left alone, even if that pid now belongs to another process.
    """
    for leaf in parent.glob("cmd-*-*"):
        owner = leaf.name.split("-")[1]
        if not owner.isdigit() or Path(f"/proc/{owner}").exists():
            continue
        try:
            leaf.rmdir()
        except OSError as exc:
            logger.warning("could not remove stale cgroup %s: %s", leaf, exc)


def _own_paths(text: str) -> dict[str, str]:
    """Map each v1 controller to this process's cgroup path from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


class CommandCgroup:
    """The leaves one command runs in; create, then kill members, then remove."""

    def __init__(self, leaves: list[Path]) -> None:
        self._leaves = leaves

    @classmethod
    def create(
        cls, host: CgroupHost, limits: ResourceLimits, *, joiner_uid: int | None
    ) -> CommandCgroup:
        """Create leaves with `limits` applied; `joiner_uid` is the uid that will join them."""
        # The server's pid in the name tells a later server which leaves are orphans.
        name = f"cmd-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        leaves: list[Path] = []
        cgroup = cls(leaves)
        try:
            if "memory" in host.parents and limits.memory_bytes is not None:
                leaf = _make_leaf(host.parents["memory"] / name, leaves)
                (leaf / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
                swap_limit = leaf / "memory.memsw.limit_in_bytes"
                if swap_limit.exists():
                    # Written after limit_in_bytes: the kernel requires memsw >= limit.
                    swap_limit.write_text(str(limits.memory_bytes))
            if "pids" in host.parents:
                leaf = _make_leaf(host.parents["pids"] / name, leaves)
                if limits.max_processes is not None:
                    (leaf / "pids.max").write_text(str(limits.max_processes))
            if joiner_uid is not None:
                # cgroup v1 lets a non-root process move itself into a cgroup whose
                # cgroup.procs it may write; the limit files stay root-only.
                for leaf in leaves:
                    os.chown(leaf / "cgroup.procs", joiner_uid, -1)
        except OSError as exc:
            cgroup.remove()
            raise SandboxError(f"could not create the command's cgroup: {exc}") from exc
        return cgroup

    @property
    def procs_files(self) -> list[Path]:
        """The files the launcher writes its pid into, before it execs the sandbox."""
        return [leaf / "cgroup.procs" for leaf in self._leaves]

    def kill(self) -> int:
        """SIGKILL every member until the cgroups are empty; return how many were signalled.

        Members can fork between reading the list and signalling it, so repeat until the
        cgroups are empty; the pids limit (when set) bounds how long that can go on.
        """
        killed = 0
        deadline = time.monotonic() + _KILL_PATIENCE_S
        while members := self._members():
            if time.monotonic() > deadline:
                raise SandboxError(
                    "processes of a command survived repeated SIGKILLs",
                    context={"cgroups": [str(leaf) for leaf in self._leaves]},
                )
            for pid in members:
                killed += sigkill(pid)
            # Killed processes stay listed until they finish exiting (freeing a large
            # address space takes a moment); pause instead of spinning on them.
            time.sleep(_KILL_PAUSE_S)
        return killed

    def dispose(self) -> None:
        """Kill any member left (e.g. when the command never started properly), then remove."""
        self.kill()
        self.remove()

    def remove(self) -> None:
        """Remove the leaves, waiting briefly for killed members to finish exiting.

        A leaf still busy after that is logged and left behind (it holds no process that
        can run: every member was SIGKILLed), rather than failing the command.
        """
        for leaf in self._leaves:
            for attempt in range(_REMOVE_ATTEMPTS):
                try:
                    leaf.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or attempt == _REMOVE_ATTEMPTS - 1:
                        logger.warning("could not remove cgroup %s: %s", leaf, exc)
                        break
                    time.sleep(_REMOVE_PAUSE_S)

    def _members(self) -> set[int]:
        members: set[int] = set()
        for procs in self.procs_files:
            members.update(int(pid) for pid in procs.read_text().split())
        return members


def _make_leaf(path: Path, leaves: list[Path]) -> Path:
    path.mkdir()
    leaves.append(path)
    return path
