"""Warm session containers: one long-lived container per session workspace and network
setting, which every command of that session joins instead of starting a container.

The registry knows nothing of how a container is made (`StartContainer`, bwrap's in
`bwrap_sessions.py`); it hands out leases on a live one. Rules it keeps (design invariant 8):
- a command is only ever joined to a container whose init is alive and whose workspace
  is still the directory the container was built on (device and inode; a workspace
  removed and made again at the same path gets a new container). A container that died
  or was killed is replaced on the next command, never bypassed;
- a container is killed after `idle_s` without a lease (by one daemon thread, which
  sleeps until the next deadline and ends when no container is left), when its workspace
  is released (`release`), and when the registry is dropped or the process exits;
- a container older than `max_age_s` is not handed out again: the next command gets a new
  one (so what a container copied from the host at its start, such as `/etc`, is never
  older than that), and the old one goes when its last lease ends;
- a container being started never holds a lease: a start that finds another one already
  registered for its key (two first commands at once) discards itself.
The lock is held only for bookkeeping and for the few system calls of a kill, so taking
it on the event loop never waits long.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from cairn._concurrency import run_sync
from cairn.errors import SandboxError
from cairn.sandbox._forkserver import ForkedCommand
from cairn.sandbox._workspace import WorkspaceIdentity

__all__ = ["ContainerKey", "SessionContainer", "SessionContainers"]

logger = logging.getLogger(__name__)

# A container that dies as soon as it is started (twice over) is not started a third time.
_STARTS = 2


@dataclass(frozen=True, slots=True)
class ContainerKey:
    workspace: str  # host path
    network: bool
    # With network: the session whose connections the container's egress door carries.
    session_id: str = ""


class SessionContainer:
    """One running container: its monitor (a fork-server command) and its init, the
    process whose namespaces commands join (a pidfd, so a recycled pid is never joined)."""

    def __init__(
        self,
        monitor: ForkedCommand,
        init_pidfd: int,
        identity: WorkspaceIdentity,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.monitor = monitor
        self.init_pidfd = init_pidfd
        self.identity = identity
        self._on_close = on_close  # releases what serves the container from outside (egress)
        self.leases = 0
        self.started = self.idle_since = time.monotonic()
        self.retired = False  # no longer handed out; killed when its last lease ends

    def is_alive(self) -> bool:
        return not select.select([self.init_pidfd], [], [], 0)[0]

    def kill(self) -> None:
        """SIGKILL the init (the kernel kills every process of its pid namespace with it)
        and the monitor; the handles stay open (`close`)."""
        try:
            signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone
        self.monitor.kill()

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
        os.close(self.init_pidfd)
        self.monitor.close()


# Starts a container for a key and workspace identity (blocking), or raises SandboxError.
StartContainer = Callable[[ContainerKey, WorkspaceIdentity], SessionContainer]


class SessionContainers:
    """The live containers of one backend, by `ContainerKey`; see the module docstring."""

    def __init__(self, start: StartContainer, *, idle_s: float, max_age_s: float) -> None:
        self._start = start
        self._pool = _Pool(idle_s, max_age_s)
        weakref.finalize(self, self._pool.close)

    @asynccontextmanager
    async def lease(self, key: ContainerKey, identity: WorkspaceIdentity) -> AsyncIterator[int]:
        """Hold the live container for `key` (starting one if needed) and yield its init's
        pidfd, valid until the block ends. Raises `SandboxError` if none can be started."""
        container = self._pool.lease(key, identity)
        starts = 0
        while container is None:
            if starts == _STARTS:
                raise SandboxError(
                    f"the session container of {key.workspace} ended each time it was started",
                    context={"starts": starts},
                )
            await run_sync(self._ensure, key, identity)
            starts += 1
            container = self._pool.lease(key, identity)
        try:
            yield container.init_pidfd
        finally:
            self._pool.release(container)

    def release(self, workspace: str) -> None:
        """Kill the containers of `workspace` now (its session is suspended or deleted)."""
        self._pool.kill_workspace(workspace)

    def _ensure(self, key: ContainerKey, identity: WorkspaceIdentity) -> None:
        """Start a container for `key` unless a usable one is registered (blocking)."""
        if self._pool.has_usable(key, identity):
            return
        self._pool.register(key, self._start(key, identity))


class _Pool:
    """The registry's state, shared with its reaper thread (which must not keep the
    `SessionContainers` alive, or dropping it would never kill anything)."""

    def __init__(self, idle_s: float, max_age_s: float) -> None:
        self._idle_s = idle_s
        self._max_age_s = max_age_s
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._containers: dict[ContainerKey, SessionContainer] = {}
        self._reaper: threading.Thread | None = None
        self._closed = False

    def lease(self, key: ContainerKey, identity: WorkspaceIdentity) -> SessionContainer | None:
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox backend has shut down its session containers")
            container = self._containers.get(key)
            if container is None:
                return None
            if not self._usable(container, identity):
                self._retire(key)
                return None
            container.leases += 1
            return container

    def release(self, container: SessionContainer) -> None:
        with self._lock:
            container.leases -= 1
            if container.leases:
                return
            if container.retired:
                container.kill()
                container.close()
            else:
                container.idle_since = time.monotonic()
                self._changed.notify()

    def has_usable(self, key: ContainerKey, identity: WorkspaceIdentity) -> bool:
        with self._lock:
            container = self._containers.get(key)
            return container is not None and self._usable(container, identity)

    def _usable(self, container: SessionContainer, identity: WorkspaceIdentity) -> bool:
        """Whether `container` may take a new lease for a workspace of `identity`."""
        return (
            container.identity == identity
            and time.monotonic() - container.started < self._max_age_s
            and container.is_alive()
        )

    def register(self, key: ContainerKey, container: SessionContainer) -> None:
        with self._lock:
            current = self._containers.get(key)
            if self._closed or (current is not None and self._usable(current, container.identity)):
                container.kill()  # shut down, or another start for this key won the race
                container.close()
                return
            if current is not None:
                self._retire(key)
            self._containers[key] = container
            if self._reaper is None:
                self._reaper = threading.Thread(
                    target=self._reap_idle, name="cairn-session-container-reaper", daemon=True
                )
                self._reaper.start()
            self._changed.notify()

    def kill_workspace(self, workspace: str) -> None:
        with self._lock:
            for key in [key for key in self._containers if key.workspace == workspace]:
                self._retire(key, now=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for key in list(self._containers):
                self._retire(key, now=True)
            self._changed.notify()

    def _retire(self, key: ContainerKey, *, now: bool = False) -> None:
        """Take `key`'s container out of use (lock held). It is killed at once if `now` or
        unleased, else when its last lease ends; its handles close when no lease holds them."""
        container = self._containers.pop(key)
        container.retired = True
        if now or not container.leases:
            container.kill()
        if not container.leases:
            container.close()

    def _reap_idle(self) -> None:
        with self._lock:
            while self._containers and not self._closed:
                now = time.monotonic()
                deadline: float | None = None
                for key, container in list(self._containers.items()):
                    if container.leases:
                        continue
                    expires = container.idle_since + self._idle_s
                    if expires <= now or not container.is_alive():
                        logger.debug("reaping the session container of %s", key.workspace)
                        self._retire(key)
                    else:
                        deadline = expires if deadline is None else min(deadline, expires)
                self._changed.wait(None if deadline is None else deadline - now)
            self._reaper = None
