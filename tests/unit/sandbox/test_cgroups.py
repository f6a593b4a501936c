"""cgroup discovery and per-command leaves, v2 first, then v1, then nothing.

This host's cgroup v2 hierarchy offers no memory or pids controller (research/sandbox.md
§3), so the v2 paths run against a fake cgroupfs: a directory tree with the files the
kernel would show (`cgroup.controllers`, `cgroup.kill`, ...) written in advance, and a fake
/proc/self/mountinfo and /proc/self/cgroup pointing at it. The v1 path runs on the real
host where it is writable.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cairn.errors import SandboxError
from cairn.sandbox import _cgroups
from cairn.sandbox._cgroups import CommandCgroup, discover_cgroups
from cairn.sandbox._containment import Containment
from cairn.sandbox.base import ResourceLimits

SERVICE = "system.slice/cairn.service"


def fake_v2_host(tmp_path: Path, *, delegated: bool) -> tuple[Path, Path, Path]:
    """A pure-v2 host: the server in `<service>/server`, commands to go in `<service>/cairn`.

    `delegated`: the service's subtree_control can be written (systemd `Delegate=yes`);
    otherwise writing it fails as the kernel's EBUSY would (here: it is a directory).
    """
    mount = tmp_path / "cgroup2"
    service = mount / SERVICE
    (service / "server").mkdir(parents=True)
    (service / "cgroup.controllers").write_text("cpu io memory pids\n")
    if delegated:
        (service / "cgroup.subtree_control").write_text("memory pids\n")
    else:
        (service / "cgroup.subtree_control").mkdir()
    cairn = service / "cairn"  # what mkdir would create, with the kernel's files in it
    cairn.mkdir()
    (cairn / "cgroup.controllers").write_text("memory pids\n" if delegated else "\n")
    (cairn / "cgroup.kill").write_text("")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"30 23 0:26 / {mount} rw,nosuid,nodev - cgroup2 cgroup2 rw\n")
    own = tmp_path / "cgroup"
    own.write_text(f"0::/{SERVICE}/server\n")
    return mountinfo, own, cairn


def test_v2_with_delegated_controllers_is_preferred(tmp_path: Path) -> None:
    mountinfo, own, cairn = fake_v2_host(tmp_path, delegated=True)
    host = discover_cgroups(mountinfo=mountinfo, cgroup_file=own)
    assert host.v2 == cairn
    assert host.v2_controllers == {"memory", "pids"}
    assert host.v1 == {} and host.unavailable == {}
    assert (cairn / "cgroup.subtree_control").read_text() == "+memory +pids"
    report = Containment(cgroups=host, nproc_counts=True).limits_in_force()
    assert report["memory_bytes"].startswith("cgroup v2 memory.max")
    assert report["max_processes"] == "cgroup v2 pids, counted per command"


def test_v2_leaf_gets_the_limits_and_is_killed_through_cgroup_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mountinfo, own, cairn = fake_v2_host(tmp_path, delegated=True)
    host = discover_cgroups(mountinfo=mountinfo, cgroup_file=own)
    cgroup = CommandCgroup.create(host, ResourceLimits(memory_bytes=64 << 20, max_processes=32))
    [procs] = cgroup.procs_files
    assert cgroup.join_files == [procs]  # v2 joins through cgroup.procs (not threaded)
    leaf = procs.parent
    assert leaf.parent == cairn and leaf.name.startswith(f"cmd-{os.getpid()}-")
    assert (leaf / "memory.max").read_text() == str(64 << 20)
    assert (leaf / "pids.max").read_text() == "32"
    # A member that never leaves (the fake kernel kills nothing) is reported, not ignored.
    procs.write_text("4194305\n")
    monkeypatch.setattr(_cgroups, "_KILL_PATIENCE_S", 0.05)
    with pytest.raises(SandboxError, match="survived"):
        cgroup.kill()
    assert (leaf / "cgroup.kill").read_text() == "1"


def test_v2_without_controllers_is_kept_for_cgroup_kill_and_says_why(tmp_path: Path) -> None:
    mountinfo, own, cairn = fake_v2_host(tmp_path, delegated=False)
    host = discover_cgroups(mountinfo=mountinfo, cgroup_file=own)
    assert host.v2 == cairn  # no v1 hierarchy tracks processes, so v2 does, for teardown
    assert host.v2_controllers == frozenset()
    assert set(host.unavailable) == {"memory", "pids"}
    assert "enabling them in" in host.unavailable["memory"]
    assert "no cgroup v1 memory hierarchy" in host.unavailable["memory"]
    report = Containment(cgroups=host, nproc_counts=True).limits_in_force()
    assert report["memory_bytes"].startswith("rlimit AS")
    assert "v2 cgroup.kill" in report["cgroups"]


def test_no_cgroups_at_all_falls_back_to_rlimits(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("22 1 0:21 / /proc rw - proc proc rw\n")
    own = tmp_path / "cgroup"
    own.write_text("0::/\n")
    host = discover_cgroups(mountinfo=mountinfo, cgroup_file=own)
    assert not host.in_use
    assert set(host.unavailable) == {"memory", "pids"}
    report = Containment(cgroups=host, nproc_counts=True).limits_in_force()
    assert report["max_processes"].startswith("rlimit NPROC")
    assert "memory unused" in report["cgroups"]
    # Without a cgroup, only a pid namespace still finds every background process.
    assert report["background_processes"].startswith("NOT all found")
    namespaced = Containment(cgroups=host, nproc_counts=True, pid_namespace=True)
    assert "pid namespace" in namespaced.limits_in_force()["background_processes"]


def test_real_host_v1_leaves_are_joined_through_tasks_and_killed() -> None:
    host = discover_cgroups()
    if not host.v1:
        pytest.skip(f"no writable cgroup v1 hierarchy here: {host.describe()}")
    cgroup = CommandCgroup.create(host, ResourceLimits())
    leaves = [join.parent for join in cgroup.join_files]
    try:
        assert [path.name for path in cgroup.join_files] == ["tasks"] * len(host.v1)
        ready_read, ready_write = os.pipe()
        child = os.fork()
        if child == 0:  # single-threaded, like the launcher: "0" moves the whole process
            try:
                for join in cgroup.join_files:
                    join.write_text("0")
                os.write(ready_write, b"x")
                time.sleep(60)  # until killed
            finally:
                os._exit(1)
        os.close(ready_write)
        assert os.read(ready_read, 1) == b"x"
        os.close(ready_read)
        own = Path(f"/proc/{child}/cgroup").read_text()
        for join in cgroup.join_files:
            assert f"/{join.parent.name}\n" in own
        assert cgroup.kill() >= 1  # counted again if still exiting at the next look
        assert os.waitpid(child, 0)[1] != 0
    finally:
        cgroup.dispose()
    assert leaves and not any(leaf.exists() for leaf in leaves)
    assert cgroup.removed and cgroup.join_files == []


def test_real_host_cgroups_and_stale_leaves_of_dead_servers() -> None:
    host = discover_cgroups()
    if not host.v1:
        pytest.skip(f"no writable cgroup v1 hierarchy here: {host.describe()}")
    parent = next(iter(host.v1.values()))
    orphan = parent / f"cmd-{2**22 + 1}-0123456789ab"  # above pid_max's default: never alive
    alive = parent / f"cmd-{os.getpid()}-0123456789ab"
    orphan.mkdir()
    alive.mkdir()
    try:
        discover_cgroups()
        assert not orphan.exists()
        assert alive.exists()
    finally:
        for leaf in (orphan, alive):
            if leaf.exists():
                leaf.rmdir()
