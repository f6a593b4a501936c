"""Fixtures shared by every test: the async backend, a throwaway PostgreSQL server, and a
fresh database per test.

Tests under `tests/conformance/` and `tests/migration/` that take `database_url` (or `db`)
run against SQLite and PostgreSQL; elsewhere they use SQLite.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from cairn.store.db import Database
from cairn.store.migrate import upgrade
from cairn.testing.postgres import PostgresUnavailableError, ThrowawayPostgres

DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
_BOTH_DATABASE_DIRS = ("conformance", "migration")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "database_url" in metafunc.fixturenames:
        parts = Path(str(metafunc.definition.path)).parts
        both = any(d in parts for d in _BOTH_DATABASE_DIRS) or metafunc.definition.get_closest_marker("postgres")
        metafunc.parametrize("database_url", DATABASES if both else ["sqlite"], indirect=True)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[ThrowawayPostgres]:
    server = ThrowawayPostgres()
    try:
        server.start()
    except PostgresUnavailableError as exc:
        server.stop()
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is required in CI: {exc}")
        pytest.skip(f"PostgreSQL unavailable here: {exc}")
    yield server
    server.stop()


@pytest.fixture
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of the kind named by the test's `db_kind` parameter."""
    kind = getattr(request, "param", "sqlite")
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'cairn.db'}"
    server: ThrowawayPostgres = request.getfixturevalue("postgres_server")
    return server.create_database(f"t_{secrets.token_hex(6)}")


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    await upgrade(database)
    yield database
    await database.dispose()


@pytest.fixture
def refuse_rename(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    """Fault injection: `os.rename` of the given path fails as if permission were denied
    (tests run as root, where a read-only directory would not stop it)."""
    rename = os.rename

    def refuse(stuck: Path) -> None:
        def refusing(source: object, target: object) -> None:
            if Path(str(source)) == stuck:
                raise PermissionError(13, "Permission denied", str(source))
            rename(source, target)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "rename", refusing)

    return refuse
