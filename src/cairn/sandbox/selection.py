"""Chooses the sandbox backend for this process, by operator choice or by probing the host.

`auto` (or no choice) takes the strongest backend that works here and logs which one and
why; it never falls back to `unconfined` (design invariant 8): when nothing isolates, it
raises and says how to opt in. `unconfined` is used only when named explicitly.
"""

from __future__ import annotations

import logging

from cairn.errors import SandboxError
from cairn.sandbox.base import SandboxBackend
from cairn.sandbox.bwrap import BwrapBackend
from cairn.sandbox.unconfined import UnconfinedBackend

__all__ = ["BACKEND_NAMES", "select_backend"]

logger = logging.getLogger(__name__)

BACKEND_NAMES = ("auto", "bwrap", "unconfined")


def select_backend(name: str | None) -> SandboxBackend:
    """Return the backend called `name`, or the best available one for None / "auto".

    Probes the host by running a command (blocking, tens of milliseconds): call it at
    startup, or through `cairn._concurrency.run_sync` from async code.
    """
    if name in (None, "auto"):
        try:
            backend: SandboxBackend = BwrapBackend.detect()
        except SandboxError as exc:
            raise SandboxError(
                f"no isolating sandbox backend works on this host ({exc}); install "
                "bubblewrap, or explicitly opt in to running commands unconfined on the "
                "host with the `unconfined` backend",
                context={"bwrap": str(exc)},
            ) from exc
        logger.info("sandbox backend chosen automatically: %s", backend.name)
        return backend
    if name == "bwrap":
        return BwrapBackend.detect()
    if name == "unconfined":
        return UnconfinedBackend()
    raise SandboxError(
        f"unknown sandbox backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}",
        code="invalid_sandbox_backend",
    )
