"""Opens the database and hands out read and write transactions.

This module holds the store's dialect switches (engine setup, the database clock, error
translation): everything above it is one set of SQLAlchemy Core queries for SQLite and
PostgreSQL alike, written against `Connection`.

PostgreSQL is used through psycopg's native async driver.

SQLite is used through a synchronous pysqlite connection *on the event loop*, on purpose.
A statement on a local WAL database takes tens of microseconds, while handing it to a
thread (what aiosqlite does, several times per statement) costs more than the work and
made every transaction ten times slower. What could block is kept off the loop instead:
- lock waits: a write transaction takes the write lock up front with `BEGIN IMMEDIATE`
  (SQLite renders no `FOR UPDATE`, and a deferred transaction that upgrades later can
  fail instead of waiting); when the lock is busy, the attempt is retried after an async
  sleep rather than waiting inside SQLite (`busy_timeout` is only a few milliseconds);
- WAL checkpoints, which write and sync the database file: automatic checkpoints are off,
  and `checkpoint()` runs one in a worker thread (the app calls it periodically).
"""

from __future__ import annotations

import logging
import random
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NamedTuple, TypeVar

import anyio
import psycopg
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from cairn._concurrency import run_sync
from cairn.errors import InvalidRequestError, StoreError

__all__ = ["Connection", "Database", "DriverParameters", "DriverResult", "InlineConnection", "async_url", "database_clock"]

T = TypeVar("T")

log = logging.getLogger(__name__)

_CHANNEL = "cairn_changes"
_BUSY_TIMEOUT_MS = 5
_LOCK_RETRY_FIRST_S = 0.0005
_LOCK_RETRY_MAX_S = 0.02
_LOCK_WAIT_LIMIT_S = 30.0
# SQLite connections kept open between transactions; more stay in SQLAlchemy's pool (5 + 10).
_IDLE_CONNECTIONS = 4


def database_clock(dialect: str) -> sa.ColumnElement[float]:
    """The database clock in epoch seconds, in `dialect`'s SQL: every process on one database
    agrees on it, whatever the machines' clocks say."""
    if dialect == "sqlite":
        return sa.literal_column("((julianday('now') - 2440587.5) * 86400.0)", sa.Float)
    return sa.literal_column("extract(epoch from clock_timestamp())::float8", sa.Float)


def async_url(url: str) -> sa.URL:
    """Turn a user-facing database URL into the driver URL Cairn uses."""
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError as exc:
        raise InvalidRequestError(f"not a database URL: {url!r}", param="database_url") from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return parsed.set(drivername="sqlite+pysqlite")
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    raise InvalidRequestError(
        f"unsupported database {backend!r}: use sqlite:///PATH or postgresql://…", param="database_url"
    )


class InlineConnection:
    """A synchronous SQLite connection with the async surface of `AsyncConnection`."""

    __slots__ = ("sync_connection",)

    def __init__(self, sync_connection: sa.Connection) -> None:
        self.sync_connection = sync_connection

    @property
    def dialect(self) -> sa.Dialect:
        return self.sync_connection.dialect

    async def execute(
        self, statement: sa.Executable, parameters: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    ) -> sa.CursorResult[Any]:
        return self.sync_connection.execute(statement, parameters)

    async def run_sync(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return fn(self.sync_connection, *args, **kwargs)

    def run_driver_sql(self, sql: str, parameters: DriverParameters | list[DriverParameters]) -> DriverResult:
        """Run SQL text on the driver's connection, in this connection's transaction, past
        SQLAlchemy's statement machinery (`cairn.store.prepared`); errors are SQLAlchemy's,
        as from `execute`, without the parameters (they may hold tool arguments)."""
        driver = self.sync_connection.connection.driver_connection
        assert driver is not None
        try:
            if isinstance(parameters, list):
                return DriverResult(driver.executemany(sql, parameters).rowcount, [])
            cursor = driver.execute(sql, parameters)
            rows = cursor.fetchall()  # also finishes a statement with RETURNING
            return DriverResult(cursor.rowcount, rows)
        except sqlite3.Error as exc:
            raise sa.exc.DBAPIError.instance(sql, None, exc, sqlite3.Error, hide_parameters=True) from exc


Connection = AsyncConnection | InlineConnection

DriverParameters = tuple[Any, ...] | dict[str, Any]


class DriverResult(NamedTuple):
    """What SQL text run on the driver returned: the rows changed, and the rows returned."""

    rowcount: int
    rows: Sequence[Sequence[Any]]


def _is_locked(exc: sa.exc.OperationalError) -> bool:
    return "locked" in str(exc.orig) or "busy" in str(exc.orig)


def _sqlite_engine(url: sa.URL, echo: bool) -> sa.Engine:
    engine = sa.create_engine(url, echo=echo, connect_args={"check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Hand transaction control to SQLAlchemy's "begin" hook below.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA wal_autocheckpoint=0")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        begin = f"BEGIN {conn.get_execution_options().get('cairn_begin', 'DEFERRED')}"
        driver = conn.connection.driver_connection
        assert driver is not None
        # Straight to the driver: SQLAlchemy's statement machinery costs more than BEGIN does.
        try:
            driver.execute(begin)
        except sqlite3.Error as exc:
            raise sa.exc.DBAPIError.instance(begin, None, exc, sqlite3.Error) from exc

    return engine


class Database:
    """One per process; `write()` and `read()` are the only ways in."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = async_url(url)
        self.dialect = self.url.get_backend_name()
        self._sync: sa.Engine | None = None
        self._async: AsyncEngine | None = None
        self._idle: list[sa.Connection] = []
        if self.dialect == "sqlite":
            self._sync = _sqlite_engine(self.url, echo)
        else:
            self._async = create_async_engine(self.url, echo=echo, pool_size=10, max_overflow=20, pool_pre_ping=True)

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    def now(self) -> sa.ColumnElement[float]:
        """The database clock in epoch seconds: lease predicates never trust a worker's clock."""
        return database_clock(self.dialect)

    def write(self) -> AbstractAsyncContextManager[Connection]:
        """A transaction that may write; committed on success, rolled back on any error."""
        return self._transaction("IMMEDIATE")

    def read(self) -> AbstractAsyncContextManager[Connection]:
        return self._transaction("DEFERRED")

    @asynccontextmanager
    async def _transaction(self, mode: str) -> AsyncIterator[Connection]:
        try:
            if self._async is not None:
                async with self._async.connect() as async_conn, async_conn.begin():
                    yield async_conn
                return
            assert self._sync is not None
            conn = self._idle.pop() if self._idle else self._sync.connect()
            try:
                conn.execution_options(cairn_begin=mode)
                await self._begin(conn)
                try:
                    yield InlineConnection(conn)
                except BaseException:
                    conn.rollback()
                    raise
                conn.commit()
            finally:
                self._release(conn)
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            raise StoreError(f"database unavailable: {exc.orig}", context={"dialect": self.dialect}) from exc

    def _release(self, conn: sa.Connection) -> None:
        """Keep a healthy SQLite connection open for the next transaction: a pool checkout and
        check-in cost more than a short transaction does."""
        if conn.invalidated or conn.in_transaction() or len(self._idle) >= _IDLE_CONNECTIONS:
            conn.close()
        else:
            self._idle.append(conn)

    async def _begin(self, conn: sa.Connection) -> None:
        """Begin, waiting for a busy write lock with async sleeps instead of inside SQLite."""
        delay = _LOCK_RETRY_FIRST_S
        deadline = time.monotonic() + _LOCK_WAIT_LIMIT_S
        while True:
            try:
                conn.begin()
                return
            except sa.exc.OperationalError as exc:
                if not _is_locked(exc) or time.monotonic() > deadline:
                    raise
                conn.rollback()
            await anyio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, _LOCK_RETRY_MAX_S)

    async def run_admin(self, fn: Callable[[sa.Connection], T]) -> T:
        """Run `fn` in one transaction in a worker thread (migrations: slow, rare, blocking)."""
        if self._async is not None:
            async with self._async.begin() as conn:
                return await conn.run_sync(fn)
        assert self._sync is not None
        engine = self._sync

        def in_thread() -> T:
            with engine.begin() as conn:
                return fn(conn)

        return await run_sync(in_thread)

    async def checkpoint(self) -> None:
        """Move the SQLite WAL into the database file, off the event loop; nothing on PostgreSQL."""
        if self._sync is None:
            return
        engine = self._sync

        def in_thread() -> None:
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

        await run_sync(in_thread)

    async def announce(self, conn: Connection, topic: str) -> None:
        """Tell other processes that `topic` changed, when this transaction commits (PostgreSQL only;
        on SQLite, other processes see changes by polling)."""
        if self._async is not None:
            await conn.execute(sa.select(sa.func.pg_notify(_CHANNEL, topic)))

    async def listen(self, on_topic: Callable[[str], None]) -> None:
        """Call `on_topic` for every `announce` of any process, until cancelled; reconnects after
        failures. Returns at once on SQLite."""
        if self._async is None:
            return
        url = self.url.set(drivername="postgresql").render_as_string(hide_password=False)
        delay = 0.5
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {_CHANNEL}")
                    delay = 0.5
                    async for notification in conn.notifies():
                        on_topic(notification.payload)
            except psycopg.Error as exc:
                log.warning("listening for changes failed (%s); retrying in %.1f s", exc, delay)
            await anyio.sleep(delay)
            delay = min(delay * 2, 30.0)

    async def watch_commits(self, on_commit: Callable[[], Awaitable[None]], *, interval_s: float) -> None:
        """SQLite: call `on_commit` after another connection (of any process) committed a change,
        noticed within `interval_s`, until cancelled; returns at once on PostgreSQL, where
        `announce` and `listen` tell processes. `PRAGMA data_version` on a connection of its
        own reads a counter in the WAL index's shared memory: a few microseconds, no disk
        read, no lock, so polling it often costs far less than polling the tables would."""
        if self._sync is None:
            return
        raw = self._sync.raw_connection()
        try:
            driver = raw.driver_connection
            assert driver is not None
            seen = driver.execute("PRAGMA data_version").fetchone()
            while True:
                await anyio.sleep(interval_s)
                version = driver.execute("PRAGMA data_version").fetchone()
                if version != seen:
                    seen = version
                    await on_commit()
        finally:
            raw.close()

    async def checkpoint_best_effort(self) -> None:
        """A checkpoint that can fail (the database is busy) and be tried again next time."""
        try:
            await self.checkpoint()
        except sa.exc.OperationalError as exc:
            log.warning("WAL checkpoint skipped: %s", exc.orig)

    async def dispose(self) -> None:
        if self._async is not None:
            await self._async.dispose()
            return
        assert self._sync is not None
        while self._idle:
            self._idle.pop().close()
        try:
            await self.checkpoint()
        finally:
            self._sync.dispose()
