"""Chooses the sandbox backend for this process, by operator choice or by probing the host.

`auto` (or no choice) takes the strongest backend that works here, in this order:
`bwrap` (user namespaces), `namespaces` (root without user namespaces), `landlock` (no
namespaces at all; host processes stay visible). Each candidate proves itself by running a
command; every one skipped is logged with its reason, a fallback is logged as a warning,
and the reasons end up in the chosen backend's `selection` / `description` (for `cairn
doctor` and the session's environment state). It never falls back to `unconfined`
(design invariant 8): when nothing isolates, it raises and says how to opt in.
Naming a backend forces it, which is also how the fallbacks are tested on a host where
bwrap works.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from cairn.errors import SandboxError
from cairn.sandbox.base import SandboxBackend
from cairn.sandbox.bwrap_sessions import detect_bwrap
from cairn.sandbox.landlock import LandlockBackend
from cairn.sandbox.namespaces import NamespacesBackend
from cairn.sandbox.unconfined import UnconfinedBackend

__all__ = ["BACKEND_NAMES", "ISOLATING_BACKENDS", "Detector", "select_backend"]

logger = logging.getLogger(__name__)

# Builds a backend after proving it works on this host, or raises SandboxError saying why.
Detector = Callable[[], SandboxBackend]

ISOLATING_BACKENDS: Mapping[str, Detector] = {
    "bwrap": detect_bwrap,
    "namespaces": NamespacesBackend.detect,
    "landlock": LandlockBackend.detect,
}
BACKEND_NAMES = ("auto", *ISOLATING_BACKENDS, "unconfined")


def select_backend(
    name: str | None, *, detectors: Mapping[str, Detector] = ISOLATING_BACKENDS
) -> SandboxBackend:
    """Return the backend called `name`, or the best available one for None / "auto".

    `detectors` (strongest first) replaces the host probes, so tests can decide which
    backends "work". Probing runs commands (blocking, tens of milliseconds): call this at
    startup, or through `cairn._concurrency.run_sync` from async code.
    """
    if name in (None, "auto"):
        return _select_automatically(detectors)
    if name in detectors:
        return detectors[name]()
    if name == "unconfined":
        return UnconfinedBackend()
    raise SandboxError(
        f"unknown sandbox backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}",
        code="invalid_sandbox_backend",
    )


def _select_automatically(detectors: Mapping[str, Detector]) -> SandboxBackend:
    skipped: dict[str, str] = {}
    for candidate, detect in detectors.items():
        try:
            backend = detect()
        except SandboxError as exc:
            skipped[candidate] = exc.message
            logger.warning("sandbox backend %s does not work here: %s", candidate, exc.message)
            continue
        if skipped:
            reasons = "; ".join(f"{name} unavailable: {why}" for name, why in skipped.items())
            backend.selection = f"chosen automatically as a FALLBACK ({reasons})"
            logger.warning("%s", backend.description)
        else:
            backend.selection = "chosen automatically (the strongest backend)"
            logger.info("%s", backend.description)
        return backend
    reasons = "; ".join(f"{name}: {why}" for name, why in skipped.items())
    raise SandboxError(
        f"no isolating sandbox backend works on this host ({reasons}); install bubblewrap, "
        "run the server as root, or enable Landlock (ABI >= 4); or explicitly opt in to "
        "running commands unconfined on the host with the `unconfined` backend",
        context=skipped,
    )
