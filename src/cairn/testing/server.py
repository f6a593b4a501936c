"""Real `cairn serve` and `cairn worker` processes, for end-to-end tests and benchmarks.

They are started with the same commands a user runs, so tests exercise the CLI, the data-dir
setup and the workers too, and they can be killed with SIGKILL to test recovery.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx
import openai

__all__ = ["CairnServer", "CairnWorker"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _CairnProcess:
    """One `cairn` subcommand on a data dir, its output appended to a log file beside it."""

    command = ""

    def __init__(
        self,
        data_dir: Path,
        *,
        scripts_dir: Path | None = None,
        database_url: str | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
        log_name: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.scripts_dir = scripts_dir
        self.database_url = database_url
        self.env = dict(env or {})
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-{log_name or self.command}.log"
        self._started_at_byte = 0

    def _argv(self) -> list[str]:
        argv = [sys.executable, "-m", "cairn.cli", self.command, "--data-dir", str(self.data_dir)]
        if self.scripts_dir is not None:
            argv += ["--scripts-dir", str(self.scripts_dir)]
        if self.database_url is not None:
            argv += ["--database-url", self.database_url]
        return argv + list(self.extra_args)

    def _launch(self, ready: Callable[[], bool], timeout_s: float) -> None:
        self._started_at_byte = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(self._argv(), stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env})
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"cairn {self.command} exited with {self.process.returncode}:\n{self.log()}")
            if ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"cairn {self.command} was not ready in {timeout_s} s:\n{self.log()}")

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_since_start(self) -> str:
        """What the process wrote since its last start (the log file spans restarts)."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(self._started_at_byte)
            return f.read().decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self, timeout_s: float = 15) -> int | None:
        """SIGTERM, then SIGKILL after `timeout_s`; the exit status, or None if it had to be killed."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None


class CairnServer(_CairnProcess):
    """`cairn serve` on a free loopback port."""

    command = "serve"

    def __init__(self, data_dir: Path, **kwargs: object) -> None:
        super().__init__(data_dir, log_name="server", **kwargs)  # type: ignore[arg-type]
        self.port = _free_port()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def admin_key(self) -> str:
        return (self.data_dir / "admin.key").read_text().strip()

    def client(self, api_key: str | None = None, **kwargs: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=api_key or self.admin_key, **kwargs)  # type: ignore[arg-type]

    def _argv(self) -> list[str]:
        return [*super()._argv(), "--port", str(self.port)]

    def start(self, timeout_s: float = 60.0) -> CairnServer:
        self._launch(self._healthy, timeout_s)
        return self

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False


class CairnWorker(_CairnProcess):
    """`cairn worker` on a data dir (and database) that a `CairnServer` has prepared."""

    command = "worker"

    def __init__(self, data_dir: Path, *, name: str = "worker", **kwargs: object) -> None:
        super().__init__(data_dir, log_name=name, **kwargs)  # type: ignore[arg-type]

    def start(self, timeout_s: float = 60.0) -> CairnWorker:
        self._launch(lambda: "worker started" in self.log_since_start(), timeout_s)
        return self
