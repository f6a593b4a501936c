"""Seeing another transaction wait for the lock a test's transaction holds, on both databases.

PostgreSQL shows a waiter: a lock request not granted in `pg_locks` (an advisory lock, or the
transaction holding a row that another one wants to update). SQLite shows
none, and its write lock is the only lock there (the sweep and publish locks take nothing
more inside `Database.write()`, store/blob_locks.py), so a SQLite waiter is known by its
attempts: every `BEGIN IMMEDIATE` passes a hook on the engines' `begin` event before it
runs, and a second attempt means that the first was refused and the writer is retrying.
"""

from __future__ import annotations

from types import TracebackType

import sqlalchemy as sa
from sqlalchemy import event

from cairn.store.db import Database
from tests.waits import until

__all__ = ["LockWaits"]

_WAITING = sa.text("SELECT count(*) FROM pg_locks WHERE NOT granted")


class LockWaits:
    """Counts write transactions begun while it is entered; enter it before the waiter starts."""

    def __init__(self) -> None:
        self.write_attempts = 0

    def __enter__(self) -> LockWaits:
        event.listen(sa.Engine, "begin", self._began)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        event.remove(sa.Engine, "begin", self._began)

    def _began(self, conn: sa.Connection) -> None:
        if conn.get_execution_options().get("cairn_begin") == "IMMEDIATE":
            self.write_attempts += 1

    async def until_another_waits(self, db: Database, what: str) -> None:
        """Until a transaction other than the holder's waits for the lock (`db`: the holder's)."""
        if db.is_sqlite:
            await until(lambda: self.write_attempts >= 2, what, seen=lambda: f"{self.write_attempts} write attempt(s)")
            return

        async def waiting() -> bool:
            async with db.read() as conn:
                return bool((await conn.execute(_WAITING)).scalar_one())

        await until(waiting, what)
