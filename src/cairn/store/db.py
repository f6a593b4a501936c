"""Opens the database and hands out read and write transactions.

This module holds the only dialect switches of the store (engine setup, the database
clock, error translation): everything above it is one set of SQLAlchemy Core queries for
SQLite and PostgreSQL alike. On SQLite a write transaction takes the write lock up front
(`BEGIN IMMEDIATE`), because SQLite renders no `FOR UPDATE` and a deferred transaction
that later upgrades to a writer can fail with "database is locked" instead of waiting.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from cairn.errors import InvalidRequestError, StoreError

__all__ = ["Database", "async_url"]

_BEGIN_MODE = "cairn_sqlite_begin"


def async_url(url: str) -> sa.URL:
    """Turn a user-facing database URL into the async driver URL Cairn uses."""
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError as exc:
        raise InvalidRequestError(f"not a database URL: {url!r}", param="database_url") from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite")
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    raise InvalidRequestError(
        f"unsupported database {backend!r}: use sqlite:///PATH or postgresql://…", param="database_url"
    )


def _install_sqlite_hooks(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Hand transaction control to SQLAlchemy's "begin" hook below.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        mode = conn.get_execution_options().get(_BEGIN_MODE, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


class Database:
    """One engine per process; `write()` and `read()` are the only ways in."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = async_url(url)
        self.dialect = self.url.get_backend_name()
        kwargs: dict[str, Any] = {"echo": echo}
        if self.dialect == "postgresql":
            kwargs.update(pool_size=10, max_overflow=20, pool_pre_ping=True)
        self.engine = create_async_engine(self.url, **kwargs)
        if self.dialect == "sqlite":
            _install_sqlite_hooks(self.engine)

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    def now(self) -> sa.ColumnElement[float]:
        """The database clock in epoch seconds: lease predicates never trust a worker's clock."""
        if self.is_sqlite:
            return sa.literal_column("((julianday('now') - 2440587.5) * 86400.0)", sa.Float)
        return sa.literal_column("extract(epoch from clock_timestamp())::float8", sa.Float)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """A transaction that may write; committed on success, rolled back on any error."""
        async with self._connect() as conn:
            if self.is_sqlite:
                conn = await conn.execution_options(**{_BEGIN_MODE: "IMMEDIATE"})
            async with conn.begin():
                yield conn

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        async with self._connect() as conn, conn.begin():
            yield conn

    @asynccontextmanager
    async def _connect(self) -> AsyncIterator[AsyncConnection]:
        try:
            async with self.engine.connect() as conn:
                yield conn
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            raise StoreError(f"database unavailable: {exc.orig}", context={"dialect": self.dialect}) from exc

    async def dispose(self) -> None:
        await self.engine.dispose()
