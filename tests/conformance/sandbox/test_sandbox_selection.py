"""Backend selection and the `cairn doctor` report: never silently unconfined."""

from __future__ import annotations

import pytest

from cairn.errors import SandboxError
from cairn.sandbox import select_backend
from cairn.sandbox.doctor import describe_host


def test_auto_picks_an_isolating_backend() -> None:
    for name in (None, "auto"):
        backend = select_backend(name)
        assert "isolation" in backend.capabilities
        assert backend.name != "unconfined"


def test_unconfined_only_by_name_and_it_says_so(caplog: pytest.LogCaptureFixture) -> None:
    backend = select_backend("unconfined")
    assert "isolation" not in backend.capabilities
    assert backend.isolation["isolation"].startswith("NONE")
    assert "isolates nothing" in caplog.text


def test_unknown_backend_is_an_error() -> None:
    with pytest.raises(SandboxError) as caught:
        select_backend("docker")
    assert caught.value.code == "invalid_sandbox_backend"


def test_doctor_reports_backend_isolation_and_limits() -> None:
    report = describe_host()
    assert "backend bwrap" in report
    for field in ("memory_bytes", "max_processes", "cpu_time_s", "file_size_bytes",
                  "open_files", "timeout_s"):
        assert field in report
    assert "WARNING" not in report


def test_doctor_warns_about_unconfined_and_reports_failures() -> None:
    assert "WARNING: this backend does not isolate" in describe_host("unconfined")
    assert "NO USABLE BACKEND" in describe_host("docker")


@pytest.mark.parametrize("name", ["namespaces", "landlock"])
def test_forced_fallbacks_report_what_they_isolate(name: str) -> None:
    try:
        backend = select_backend(name)
    except SandboxError as exc:
        pytest.skip(f"backend {name!r} does not work on this host: {exc.message}")
    assert "isolation" in backend.capabilities
    assert backend.description.startswith(f"sandbox backend {name} (isolates files")
    report = describe_host(name)
    assert f"backend {name}" in report and "timeout_s" in report
    hides_processes = "process_isolation" in backend.capabilities
    assert ("host processes are visible" in report) is not hides_processes
