"""End-to-end fixtures: a real `cairn serve` process driven by the official `openai` client."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from cairn.testing.postgres import ThrowawayPostgres
from cairn.testing.server import CairnServer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_DIRS = (ROOT / "src" / "cairn" / "demo_scripts", Path(__file__).parent / "scripts")


@pytest.fixture(scope="session")
def scripts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("scripts")
    for directory in SCRIPT_DIRS:
        for script in directory.glob("*.json"):
            shutil.copy(script, target / script.name)
    return target


DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def database_url_for(request: pytest.FixtureRequest, database: str, prefix: str) -> str | None:
    """None for SQLite (the data dir's own file), else a fresh database on the throwaway PostgreSQL."""
    if database != "postgres":
        return None
    pg: ThrowawayPostgres = request.getfixturevalue("postgres_server")
    return pg.create_database(f"{prefix}_{secrets.token_hex(4)}")


def make_server(scripts_dir: Path, **kwargs: object) -> CairnServer:
    # Data dirs live under /tmp, not pytest's 0700 tree: the sandbox's unprivileged uid
    # must traverse the path to reach a workspace, as on a real host.
    root = Path(tempfile.mkdtemp(prefix="cairn-e2e-"))
    os.chmod(root, 0o711)
    return CairnServer(root / "data", scripts_dir=scripts_dir, **kwargs)  # type: ignore[arg-type]


def remove_server(instance: CairnServer) -> None:
    instance.stop()
    shutil.rmtree(instance.data_dir.parent)


@pytest.fixture(scope="module")
def server(scripts_dir: Path) -> Iterator[CairnServer]:
    """One embedded server (SQLite) shared by a test module."""
    instance = make_server(scripts_dir).start()
    yield instance
    remove_server(instance)


@pytest.fixture
def client(server: CairnServer) -> Iterator[openai.OpenAI]:
    with server.client() as instance:
        yield instance
