"""A real `cairn serve` process on a free loopback port, for end-to-end tests and benchmarks.

It is started with the same command a user runs, so tests exercise the CLI, the data-dir
setup and the embedded worker too, and it can be killed with SIGKILL to test recovery.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
import openai

__all__ = ["CairnServer"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CairnServer:
    def __init__(
        self,
        data_dir: Path,
        *,
        scripts_dir: Path | None = None,
        database_url: str | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.data_dir = data_dir
        self.scripts_dir = scripts_dir
        self.database_url = database_url
        self.env = dict(env or {})
        self.extra_args = extra_args
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-server.log"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def admin_key(self) -> str:
        return (self.data_dir / "admin.key").read_text().strip()

    def client(self, api_key: str | None = None, **kwargs: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=api_key or self.admin_key, **kwargs)  # type: ignore[arg-type]

    def start(self, timeout_s: float = 60.0) -> CairnServer:
        argv = [sys.executable, "-m", "cairn.cli", "serve", "--data-dir", str(self.data_dir), "--port", str(self.port)]
        if self.scripts_dir is not None:
            argv += ["--scripts-dir", str(self.scripts_dir)]
        if self.database_url is not None:
            argv += ["--database-url", self.database_url]
        argv += list(self.extra_args)
        env = {**os.environ, **self.env}
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"cairn serve exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"cairn serve did not become healthy in {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
