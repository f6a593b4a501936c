"""A throwaway PostgreSQL server in a temporary directory, started in about a second.

PostgreSQL refuses to run as root, so as root the server runs as the `postgres` system
user (Debian's package creates it). Durability is switched off (fsync, synchronous
commit): the data dies with the test run anyway.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg

__all__ = ["PostgresUnavailableError", "ThrowawayPostgres"]


class PostgresUnavailableError(RuntimeError):
    """The machine cannot start a PostgreSQL server (binaries or the postgres user missing)."""


def _bin_dir() -> Path:
    initdb = shutil.which("initdb")
    if initdb is not None:
        return Path(initdb).resolve().parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not candidates:
        raise PostgresUnavailableError("no initdb found (install postgresql, or put its bin directory on PATH)")
    return candidates[-1].parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThrowawayPostgres:
    def __init__(self) -> None:
        self.bin_dir = _bin_dir()
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="cairn-pg-"))
        self.user = "postgres" if os.geteuid() == 0 else getpass.getuser()
        self._as_root = os.geteuid() == 0
        self._started = False

    def _run(self, *argv: str) -> None:
        command = [str(self.bin_dir / argv[0]), *argv[1:]]
        if self._as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise PostgresUnavailableError(f"{argv[0]} failed: {result.stderr.strip() or result.stdout.strip()}")

    def start(self) -> str:
        if self._as_root:
            try:
                shutil.chown(self.root, user="postgres")
            except LookupError as exc:
                raise PostgresUnavailableError("running as root needs a `postgres` system user") from exc
        data = self.root / "data"
        self._run("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        )
        self._run("pg_ctl", "-D", str(data), "-l", str(self.root / "server.log"), "-w", "-o", options, "start")
        self._started = True
        return self.url("postgres")

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def __enter__(self) -> ThrowawayPostgres:
        """Start the server for a `with` block (its directory removed if it cannot start)."""
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._started:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "stop")
            self._started = False
        shutil.rmtree(self.root, ignore_errors=True)
