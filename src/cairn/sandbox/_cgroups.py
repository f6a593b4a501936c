"""Per-command cgroups: memory and process-count limits, and a handle to kill every member.

Found once per backend (`discover_cgroups`), per controller, in this order of preference:
1. cgroup v2, where the unified hierarchy is writable and offers the controller. Leaves go
   under `<parent of the server's own cgroup>/cairn`: v2 forbids controllers in a cgroup
   that holds processes, so the server's own cgroup cannot be their parent (under systemd,
   run the server with `Delegate=yes` and `DelegateSubgroup=`). Limits are `memory.max`
   (swap off) and `pids.max`; teardown is one write to `cgroup.kill`.
2. cgroup v1, where that controller's hierarchy is writable (the reference host: memory
   and pids are v1, its v2 hierarchy offers neither, research/sandbox.md §3). Memory
   cgroups nest under the server's own memory cgroup so its limit still covers commands.
3. neither: the caller falls back to rlimits (`_rlimits.py`) and says so.
A v2 leaf is also used with no controller at all when no v1 hierarchy can track a
command's processes, for `cgroup.kill` alone. Each command gets fresh leaves, joined by its
launcher before the sandbox starts, so every process it creates is counted and killable.

The launcher joins a v1 leaf by writing "0" to its `tasks` file, not its pid to
`cgroup.procs`: for the single-threaded launcher both move the whole process, but only
moving the calling thread skips the kernel's global `cgroup_threadgroup_rwsem` write lock,
whose RCU grace period cost ~12-15 ms per command on the reference host whenever commands
were not back to back (Linux >= 6.1; older kernels take the lock either way). v2 allows
that only within a threaded subtree, so a v2 leaf is joined through `cgroup.procs`.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from cairn.errors import SandboxError
from cairn.sandbox._kill import sigkill
from cairn.sandbox.base import ResourceLimits

__all__ = ["CgroupHost", "CommandCgroup", "discover_cgroups"]

logger = logging.getLogger(__name__)

_CONTROLLERS = ("memory", "pids")
# The file whose presence proves a controller's v1 hierarchy is mounted there.
_V1_PROBES = {"memory": "memory.limit_in_bytes", "pids": "pids.max"}
_KILL_PATIENCE_S = 10.0
_KILL_PAUSE_S = 0.002
_REMOVE_ATTEMPTS = 40
_REMOVE_PAUSE_S = 0.005


@dataclass(frozen=True, slots=True)
class CgroupHost:
    """Where per-command cgroups are created, per controller, and why others are unused.

    `v1` maps a controller to the directory its v1 leaves go in; `v2` is the directory v2
    leaves go in (None: no v2 leaves), with `v2_controllers` enabled for them.
    """

    v1: dict[str, Path] = field(default_factory=dict)
    v2: Path | None = None
    v2_controllers: frozenset[str] = frozenset()
    unavailable: dict[str, str] = field(default_factory=dict)
    v2_note: str = ""  # what the v2 hierarchy offers, or why it is not used

    def version_of(self, controller: str) -> int | None:
        if controller in self.v2_controllers:
            return 2
        return 1 if controller in self.v1 else None

    @property
    def in_use(self) -> bool:
        return self.v2 is not None or bool(self.v1)

    def describe(self) -> str:
        parts = [f"v2 {name} under {self.v2}" for name in sorted(self.v2_controllers)]
        parts += [f"v1 {name} under {parent}" for name, parent in sorted(self.v1.items())]
        if self.v2 is not None:
            parts.append(f"v2 cgroup.kill under {self.v2}")
        parts += [f"{name} unused: {why}" for name, why in sorted(self.unavailable.items())]
        if not self.v2_controllers and not self.unavailable and self.v2_note:
            parts.append(f"v2 unused: {self.v2_note}")
        return "; ".join(parts) or "none"


def discover_cgroups(
    *,
    mountinfo: Path = Path("/proc/self/mountinfo"),
    cgroup_file: Path = Path("/proc/self/cgroup"),
) -> CgroupHost:
    """Find writable cgroup hierarchies for this process, v2 first; see the module docstring.

    Creates the `cairn` parent directories it finds usable (and removes leaves orphaned by
    a server that died). The paths are parameters so tests can hand in a fake cgroupfs.
    """
    v1_mounts, v2_mount = _mounts(mountinfo.read_text())
    own = _own_paths(cgroup_file.read_text())
    unavailable: dict[str, str] = {}
    v2_parent: Path | None = None
    v2_enabled: frozenset[str] = frozenset()
    if v2_mount is None or "" not in own:
        v2_reason = "no cgroup v2 hierarchy for this process"
    else:
        v2_parent, v2_enabled, v2_reason = _discover_v2(v2_mount, own[""])
    v1: dict[str, Path] = {}
    for controller in _CONTROLLERS:
        if controller in v2_enabled:
            continue
        if controller not in v1_mounts or controller not in own:
            unavailable[controller] = f"{v2_reason}; no cgroup v1 {controller} hierarchy"
            continue
        parent, why = _discover_v1(controller, _join(v1_mounts[controller], own[controller]))
        if parent is None:
            unavailable[controller] = f"{v2_reason}; {why}"
        else:
            v1[controller] = parent
    if v2_parent is not None and not v2_enabled and v1:
        v2_parent = None  # v1 already tracks every process; a v2 leaf would add nothing
    for parent in [*v1.values(), *([v2_parent] if v2_parent is not None else [])]:
        _remove_stale_leaves_best_effort(parent)
    return CgroupHost(
        v1=v1, v2=v2_parent, v2_controllers=v2_enabled, unavailable=unavailable, v2_note=v2_reason
    )


def _discover_v2(mount: Path, own_path: str) -> tuple[Path | None, frozenset[str], str]:
    """Return (parent for leaves, controllers enabled for them, why others are not)."""
    own_dir = _join(mount, own_path)
    base = own_dir if own_dir == mount else own_dir.parent
    parent = base / "cairn"
    try:
        parent.mkdir(exist_ok=True)
    except OSError as exc:
        return None, frozenset(), f"cgroup v2 at {base} is not writable: {exc}"
    if not (parent / "cgroup.kill").exists():
        return None, frozenset(), f"cgroup v2 at {parent} has no cgroup.kill (kernel < 5.14)"
    offered = _words(parent / "cgroup.controllers")
    missing = set(_CONTROLLERS) - offered
    enable_in_base = sorted(missing & _words(base / "cgroup.controllers"))
    why_base = ""
    if enable_in_base:
        try:
            (base / "cgroup.subtree_control").write_text(
                " ".join(f"+{name}" for name in enable_in_base)
            )
        except OSError as exc:  # EBUSY: the base holds processes (not delegated to us)
            why_base = f" (enabling them in {base} failed: {exc})"
        offered = _words(parent / "cgroup.controllers")
    enabled = frozenset(name for name in _CONTROLLERS if name in offered)
    if enabled:
        try:
            (parent / "cgroup.subtree_control").write_text(
                " ".join(f"+{name}" for name in sorted(enabled))
            )
        except OSError as exc:
            return parent, frozenset(), f"cgroup v2 controllers cannot be enabled in {parent}: {exc}"
    shown = " ".join(sorted(offered)) or "none"
    return parent, enabled, f"cgroup v2 at {parent} offers controllers: {shown}{why_base}"


def _discover_v1(controller: str, own_dir: Path) -> tuple[Path | None, str]:
    parent = own_dir / "cairn"
    probe_leaf = parent / f"probe-{uuid.uuid4().hex[:8]}"
    try:
        parent.mkdir(exist_ok=True)
        probe_leaf.mkdir()
        # The root cgroup has no limit files, so look for them in a child.
        is_controller = (probe_leaf / _V1_PROBES[controller]).exists()
        probe_leaf.rmdir()
    except OSError as exc:
        return None, f"cgroup v1 {controller} at {parent} is not writable: {exc}"
    if not is_controller:
        return None, f"{parent} is not a cgroup v1 {controller} hierarchy"
    return parent, ""


def _mounts(text: str) -> tuple[dict[str, Path], Path | None]:
    """The v1 mount point per controller and the v2 mount point, from /proc/self/mountinfo."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in text.splitlines():
        fields, _, tail = line.partition(" - ")
        mount_point = Path(fields.split()[4])
        fstype, _, super_options = tail.split()[:3]
        if fstype == "cgroup2" and v2 is None:
            v2 = mount_point
        elif fstype == "cgroup":
            for option in super_options.split(","):
                if option in _CONTROLLERS:
                    v1.setdefault(option, mount_point)
    return v1, v2


def _own_paths(text: str) -> dict[str, str]:
    """Map each controller (v1) and "" (v2) to this process's cgroup path."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _join(mount: Path, path: str) -> Path:
    return mount / path.lstrip("/")


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except FileNotFoundError:
        return set()


def _remove_stale_leaves_best_effort(parent: Path) -> None:
    """Remove leaves left by a server that died (e.g. SIGKILL) before cleaning up.

    Their processes died with it, so the leaves are empty. A leaf whose server pid is alive
    is left alone, even if that pid now belongs to another process.
    """
    for leaf in parent.glob("cmd-*-*"):
        owner = leaf.name.split("-")[1]
        if not owner.isdigit() or Path(f"/proc/{owner}").exists():
            continue
        try:
            leaf.rmdir()
        except OSError as exc:
            logger.warning("could not remove stale cgroup %s: %s", leaf, exc)


class CommandCgroup:
    """The leaves one command runs in; create, then kill members, then remove."""

    def __init__(self, v1_leaves: list[Path], v2_leaf: Path | None) -> None:
        self._v1_leaves = v1_leaves
        self._v2_leaf = v2_leaf

    @classmethod
    def create(cls, host: CgroupHost, limits: ResourceLimits) -> CommandCgroup:
        """Create leaves with `limits` applied."""
        # The server's pid in the name tells a later server which leaves are orphans.
        name = f"cmd-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        cgroup = cls([], None)
        try:
            if host.v2 is not None:
                cgroup._v2_leaf = leaf = host.v2 / name
                leaf.mkdir()
                if "memory" in host.v2_controllers and limits.memory_bytes is not None:
                    (leaf / "memory.max").write_text(str(limits.memory_bytes))
                    if (leaf / "memory.swap.max").exists():
                        (leaf / "memory.swap.max").write_text("0")
                if "pids" in host.v2_controllers and limits.max_processes is not None:
                    (leaf / "pids.max").write_text(str(limits.max_processes))
            if "memory" in host.v1 and limits.memory_bytes is not None:
                leaf = cgroup._add_v1(host.v1["memory"] / name)
                (leaf / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
                swap_limit = leaf / "memory.memsw.limit_in_bytes"
                if swap_limit.exists():
                    # Written after limit_in_bytes: the kernel requires memsw >= limit.
                    swap_limit.write_text(str(limits.memory_bytes))
            if "pids" in host.v1:
                leaf = cgroup._add_v1(host.v1["pids"] / name)
                if limits.max_processes is not None:
                    (leaf / "pids.max").write_text(str(limits.max_processes))
        except OSError as exc:
            cgroup.remove()
            raise SandboxError(f"could not create the command's cgroup: {exc}") from exc
        return cgroup

    def _add_v1(self, path: Path) -> Path:
        path.mkdir()
        self._v1_leaves.append(path)
        return path

    @property
    def _leaves(self) -> list[Path]:
        return [*([self._v2_leaf] if self._v2_leaf is not None else []), *self._v1_leaves]

    @property
    def procs_files(self) -> list[Path]:
        """Each leaf's `cgroup.procs`: the processes in it."""
        return [leaf / "cgroup.procs" for leaf in self._leaves]

    @property
    def join_files(self) -> list[Path]:
        """The files the single-threaded launcher writes "0" into to join every leaf, before
        it execs the sandbox (v1 `tasks`: see the module docstring)."""
        v2 = [self._v2_leaf / "cgroup.procs"] if self._v2_leaf is not None else []
        return [*v2, *(leaf / "tasks" for leaf in self._v1_leaves)]

    def kill(self) -> int:
        """SIGKILL every member until the cgroups are empty; return how many there were.

        With a v2 leaf one write to `cgroup.kill` kills them all, forks included. Otherwise
        members can fork between reading the list and signalling it, so repeat until the
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
            if self._v2_leaf is not None:
                (self._v2_leaf / "cgroup.kill").write_text("1")
                killed += len(members)
            else:
                killed += sum(sigkill(pid) for pid in members)
            # Killed processes stay listed until they finish exiting (freeing a large
            # address space takes a moment); pause instead of spinning on them.
            time.sleep(_KILL_PAUSE_S)
        return killed

    def dispose(self) -> None:
        """Kill any member left (e.g. when the command never started properly), then remove."""
        self.kill()
        self.remove()

    @property
    def removed(self) -> bool:
        """Every leaf is gone (`remove` succeeded): nothing is left to kill or remove."""
        return not self._leaves

    def remove(self) -> None:
        """Remove the leaves, waiting briefly for killed members to finish exiting.

        A leaf still busy after that is logged and left behind (it holds no process that
        can run: every member was SIGKILLed), rather than failing the command; a later
        `dispose` tries it again. Removed leaves are forgotten.
        """
        for leaf in self._leaves:
            for attempt in range(_REMOVE_ATTEMPTS):
                try:
                    leaf.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    if exc.errno != errno.EBUSY or attempt == _REMOVE_ATTEMPTS - 1:
                        logger.warning("could not remove cgroup %s: %s", leaf, exc)
                        break
                    time.sleep(_REMOVE_PAUSE_S)
                    continue
                self._forget(leaf)
                break

    def _forget(self, leaf: Path) -> None:
        if leaf == self._v2_leaf:
            self._v2_leaf = None
        else:
            self._v1_leaves.remove(leaf)

    def _members(self) -> set[int]:
        members: set[int] = set()
        for procs in self.procs_files:
            members.update(int(pid) for pid in procs.read_text().split())
        return members
