"""The write path for everything that happens in a session: state changes plus their events.

A `Journal.transaction` gathers the events a change emits and appends them to the log in
the same database transaction (design invariant 1: durable before sent); the committed
records are handed to this process's subscribers only after the commit. A worker running
a turn fences each of its transactions with its lease token (`cairn.engine.loop.recorder`), so a
worker that lost its lease cannot write (style: storage).

Every transaction of a session takes the session row's lock first. Appending events writes
that row anyway, at the end; taking it at the start orders all of a session's writers the
same way, so on PostgreSQL a worker that fenced its turn row cannot deadlock with a request
that locked the session and then touches the turn (a cancel), and a worker that ends a turn
sees every turn queued before it (or the request queuing one sees the turn ended).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from cairn.engine.notifier import Notifier
from cairn.redaction import Redactor, SessionRedactors
from cairn.states import ItemStatus
from cairn.store.db import Connection, Database
from cairn.store.events import EventRecord, append_events
from cairn.store.items import ItemRecord, insert_item, transition_item
from cairn.store.sessions import lock_session

__all__ = ["JOBS_TOPIC", "SESSION_TOPIC", "Journal", "Transaction", "wake_on_topic"]

# What `Database.announce` says to other processes; `wake_on_topic` turns it into wake-ups.
SESSION_TOPIC = "session:"
JOBS_TOPIC = "jobs"


def wake_on_topic(notifier: Notifier, topic: str) -> None:
    """Another process changed something: wake this process's subscribers or workers."""
    if topic == JOBS_TOPIC:
        notifier.job_queued()
    elif topic.startswith(SESSION_TOPIC):
        notifier.session_changed(topic[len(SESSION_TOPIC) :])


@dataclass(slots=True)
class Transaction:
    conn: Connection
    session_id: str
    # The session's known secret values, as this process holds them now.
    redactor: Redactor = field(default_factory=Redactor)
    pending: list[dict[str, Any]] = field(default_factory=list)
    appended: list[EventRecord] = field(default_factory=list)
    jobs_queued: bool = False

    def emit(self, *payloads: dict[str, Any]) -> None:
        self.pending.extend(payloads)

    async def insert_item(self, record: ItemRecord) -> ItemRecord:
        """Store a new item of the session, known secret values redacted."""
        if not self.redactor.is_empty:
            record = dataclasses.replace(record, data=self.redactor.value(record.data))
        return await insert_item(self.conn, record)

    async def transition_item(self, item: ItemRecord, to: ItemStatus, *, data: dict[str, Any]) -> ItemRecord:
        """Close `item` with its final content (`cairn.store.items.transition_item`), known secret
        values redacted."""
        return await transition_item(self.conn, item, to, data=self.redactor.value(data))


class Journal:
    def __init__(self, db: Database, notifier: Notifier, redactors: SessionRedactors | None = None) -> None:
        self.db = db
        self.notifier = notifier
        self.redactors = redactors if redactors is not None else SessionRedactors()

    @asynccontextmanager
    async def transaction(self, session_id: str) -> AsyncIterator[Transaction]:
        async with self.db.write() as conn:
            await lock_session(conn, session_id)
            tx = Transaction(conn=conn, session_id=session_id, redactor=self.redactors.for_session(session_id))
            yield tx
            # Read again: the operator's code may have registered a value during the transaction.
            redactor = self.redactors.for_session(session_id)
            tx.appended = await append_events(conn, session_id, [redactor.value(p) for p in tx.pending])
            if tx.appended:
                await self.db.announce(conn, f"{SESSION_TOPIC}{session_id}")
            if tx.jobs_queued:
                await self.db.announce(conn, JOBS_TOPIC)
        if tx.appended:
            self.notifier.session_changed(session_id, tx.appended)
        if tx.jobs_queued:
            self.notifier.job_queued()
