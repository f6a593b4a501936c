"""Automatic backend selection with injected probe results: best first, reported, never
silently unconfined. The real probes run in tests/conformance/sandbox/test_sandbox_selection.py."""

from __future__ import annotations

import logging

import pytest

from cairn.errors import SandboxError
from cairn.sandbox import ExecRequest, ExecResult, OutputSink, SandboxBackend, select_backend
from cairn.sandbox.landlock import LandlockBackend


class Strong(SandboxBackend):
    name = "strong"
    capabilities = frozenset({"isolation", "process_isolation", "workspace_mount"})

    async def exec(self, request: ExecRequest, on_output: OutputSink) -> ExecResult:
        raise NotImplementedError


class Weak(Strong):
    name = "weak"
    capabilities = frozenset({"isolation"})


def refuse(reason: str) -> SandboxBackend:
    raise SandboxError(reason)


def test_auto_takes_the_strongest_that_works() -> None:
    backend = select_backend(None, detectors={"strong": Strong, "weak": Weak})
    assert isinstance(backend, Strong)
    assert "chosen automatically (the strongest backend)" in backend.description


def test_a_fallback_is_reported_with_the_reasons(caplog: pytest.LogCaptureFixture) -> None:
    detectors = {"strong": lambda: refuse("user namespaces are disabled"), "weak": Weak}
    with caplog.at_level(logging.INFO):
        backend = select_backend("auto", detectors=detectors)
    assert isinstance(backend, Weak)
    assert "FALLBACK" in backend.selection
    assert "strong unavailable: user namespaces are disabled" in backend.selection
    assert "host processes are visible" in backend.description
    warnings = [record.message for record in caplog.records if record.levelno == logging.WARNING]
    assert any("user namespaces are disabled" in message for message in warnings)
    assert any("FALLBACK" in message for message in warnings)


def test_nothing_works_is_an_error_not_unconfined() -> None:
    detectors = {"strong": lambda: refuse("no bwrap"), "weak": lambda: refuse("no landlock")}
    with pytest.raises(SandboxError) as caught:
        select_backend(None, detectors=detectors)
    assert "no bwrap" in caught.value.message and "no landlock" in caught.value.message
    assert "unconfined" in caught.value.message  # says how to opt in


def test_a_named_backend_is_forced_without_probing_the_others() -> None:
    backend = select_backend("weak", detectors={"strong": lambda: refuse("unused"), "weak": Weak})
    assert isinstance(backend, Weak)
    assert backend.selection == "named explicitly by the operator"


def test_landlock_refuses_an_abi_that_cannot_confine_tcp() -> None:
    with pytest.raises(SandboxError, match="Landlock ABI 3"):
        LandlockBackend.detect(abi=3)
