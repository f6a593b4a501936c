"""The sweep lock: orders blob garbage collection against artifact publishing.

A sweep holds it exclusively while it checks which blobs are referenced and moves the
unreferenced ones aside; a publish holds it shared while it checks that its blobs exist
and inserts the artifact rows that reference them. Either the publish commits first and
the sweep sees its rows, or the sweep finishes first and the publish sees what it removed
(the argument in full: `cairn.engine.blob_gc`). Both hold it until the transaction that
took it ends, and that must be a `Database.write()` transaction.

The dialects differ only here. A SQLite write transaction already excludes every other
writer of the database file in every process (`BEGIN IMMEDIATE` takes its write lock), so
there is nothing more to take. PostgreSQL takes a transaction-level advisory lock on one
key, which the database holds for every server at once; publishes share it.
"""

from __future__ import annotations

import sqlalchemy as sa

from cairn.errors import CairnMisuseError
from cairn.store.db import Connection, InlineConnection

__all__ = ["hold_publish_lock", "hold_sweep_lock"]

# An arbitrary constant key ("cairnblb"); no other advisory lock in Cairn uses it.
_ADVISORY_KEY = int.from_bytes(b"cairnblb", "big")


async def hold_publish_lock(conn: Connection) -> None:
    """Shared with other publishes; waits while a sweep holds the lock."""
    if not _is_sqlite_write(conn):
        await conn.execute(sa.select(sa.func.pg_advisory_xact_lock_shared(_ADVISORY_KEY)))


async def hold_sweep_lock(conn: Connection) -> None:
    """Exclusive; waits until the publishes in flight have committed or rolled back."""
    if not _is_sqlite_write(conn):
        await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_ADVISORY_KEY)))


def _is_sqlite_write(conn: Connection) -> bool:
    if not isinstance(conn, InlineConnection):
        return False
    # `Database.write()` begins IMMEDIATE (store/db.py); a deferred read would lock nothing.
    if conn.sync_connection.get_execution_options().get("cairn_begin") != "IMMEDIATE":
        raise CairnMisuseError("the sweep lock is taken inside Database.write(), not a read transaction")
    return True
