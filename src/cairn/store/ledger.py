"""The idempotency ledger: one entry per side effect, claimed and settled under a job's lease.

An entry is keyed by an operation key the engine derives (never the model), stores the
digest of the arguments it was claimed with, and moves through `LEDGER_TRANSITIONS`
(cairn/states.py). Claiming is one atomic step: an `INSERT … ON CONFLICT DO NOTHING` makes the
first claimant the holder; everyone else reads the entry under its row lock (PostgreSQL) or
the database's write lock (SQLite) and learns what to do (`Claim`).

The holder is a job claim, named by its lease token. Whether a holder still lives is its
job's lease, on the database clock: a dead holder's `reserved` entry is taken over (the tool
never started); its `executing` entry is not (the outcome is unknown: probe, or `uncertain`).
Every transition a worker makes presents its token and holds only while that token's job is
still running: a worker whose job was taken over changes nothing (fencing; design invariant 5).

Outside the workers: a turn that ends closes what its calls left unsettled
(`close_turn_entries`), a person resolves an `uncertain` entry (`resolve_entry`), and the
retention sweep deletes settled entries of turns long over (`sweep_settled_entries`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from cairn.errors import InvalidRequestError, StatusConflictError
from cairn.states import LEDGER_TRANSITIONS, JobStatus, LedgerStatus, TurnStatus
from cairn.store.db import Connection
from cairn.store.pages import Order, Page, fetch_page
from cairn.store.prepared import Prepared
from cairn.store.tables import jobs, ledger_entries, turns

__all__ = [
    "Claim",
    "ClaimKind",
    "LedgerEntry",
    "Operation",
    "claim_operation",
    "close_turn_entries",
    "forget_session_results",
    "get_entry",
    "list_entries",
    "referenced_result_blobs",
    "reopen_entry",
    "resolve_entry",
    "settle_entry",
    "start_execution",
    "sweep_settled_entries",
]

_L = LedgerStatus
_SETTLED = frozenset({_L.SUCCEEDED, _L.FAILED_TERMINAL})
# A turn that may still run its calls (queued ones have none yet).
_ACTIVE_TURN = (TurnStatus.QUEUED, TurnStatus.IN_PROGRESS, TurnStatus.WAITING)


@dataclass(frozen=True, slots=True)
class Operation:
    """What a claim is for: the entry a first claim creates."""

    operation_key: str
    tenant: str
    session_id: str
    turn_id: str
    call_id: str
    approval_id: str | None
    tool_name: str
    arguments_digest: str


@dataclass(frozen=True, slots=True)
class LedgerEntry(Operation):
    """An operation's entry as stored: its status, holder and outcome."""

    status: LedgerStatus
    attempts: int
    holder_token: int | None
    retry_after: float | None
    result: Mapping[str, Any] | None
    result_blob: str | None
    error: str | None
    reason: str | None
    resolved_by: str | None
    reuses: int
    created_at: float
    updated_at: float


_ENTRY_COLUMNS = tuple(f.name for f in dataclasses.fields(LedgerEntry))
_OPERATION_COLUMNS = tuple(f.name for f in dataclasses.fields(Operation))


class ClaimKind(StrEnum):
    RUN = "run"  # this claimant holds the entry: start it (start_execution) and run the tool
    REUSE = "reuse"  # succeeded before: its stored result is the call's result
    FAILED = "failed"  # failed_terminal: its error is the call's result
    WAIT = "wait"  # another live worker holds it, or a retry is not due yet
    PROBE = "probe"  # its holder died while the tool ran: ask the tool whether it happened
    UNCERTAIN = "uncertain"  # nobody knows whether it happened; a person must resolve it
    CONFLICT = "conflict"  # the same key was claimed with other arguments: never run


@dataclass(frozen=True, slots=True)
class Claim:
    kind: ClaimKind
    entry: LedgerEntry
    # WAIT for a retry not due yet: how long until it is (database clock); None for a live holder.
    wait_s: float | None = None


def _entry(row: sa.Row[Any]) -> LedgerEntry:
    values = {c: getattr(row, c) for c in _ENTRY_COLUMNS}
    values["status"] = LedgerStatus(values["status"])
    return LedgerEntry(**values)


def _job_running(token: Any, now: sa.ColumnElement[float] | None) -> sa.Exists:
    """The job claim named by `token` still runs (and, with `now`, its lease has not run out)."""
    condition = [jobs.c.lease_token == token, jobs.c.status == JobStatus.RUNNING]
    if now is not None:
        condition.append(jobs.c.lease_expires_at >= now)
    return sa.select(jobs.c.id).where(*condition).exists()


# The hot path (a first claim, its start, its settlement) runs as prepared statements
# (`cairn.store.prepared`): every side-effecting call pays for these three, and SQLAlchemy's
# per-execution work on them cost several times what the database does. They return counts
# only; the entry they leave is built from what was written.

_FIRST_COLUMNS = (*_OPERATION_COLUMNS, "status", "holder_token", "created_at", "updated_at")
# An INSERT that does nothing when the key exists; both dialects spell it the same, but each
# has its own construct for it.
_INSERT_FIRST = {
    "postgresql": Prepared(
        postgresql.insert(ledger_entries).on_conflict_do_nothing(index_elements=["operation_key"]), column_keys=_FIRST_COLUMNS
    ),
    "sqlite": Prepared(
        sqlite.insert(ledger_entries).on_conflict_do_nothing(index_elements=["operation_key"]), column_keys=_FIRST_COLUMNS
    ),
}
# The entry is still in the status its writer read and held by the writer's job claim, whose
# job still runs (the fence of every worker transition).
_HELD = (
    ledger_entries.c.operation_key == sa.bindparam("key"),
    ledger_entries.c.status == sa.bindparam("from_status"),
    ledger_entries.c.holder_token == sa.bindparam("token"),
    _job_running(sa.bindparam("token"), None),
)
_START = Prepared(
    sa.update(ledger_entries)
    .where(*_HELD)
    .values(
        status=sa.bindparam("to_status"),
        attempts=ledger_entries.c.attempts + 1,
        updated_at=sa.bindparam("stamp"),
    )
)
_SETTLE = Prepared(
    sa.update(ledger_entries)
    .where(*_HELD)
    .values(
        status=sa.bindparam("to_status"),
        result=sa.bindparam("result", type_=ledger_entries.c.result.type),
        result_blob=sa.bindparam("result_blob"),
        error=sa.bindparam("error"),
        reason=sa.bindparam("reason"),
        updated_at=sa.bindparam("stamp"),
    )
)


async def _held_move(conn: Connection, statement: Prepared, entry: LedgerEntry, to: LedgerStatus, token: int, **values: Any) -> float:
    """Run a prepared move of `entry` to `to` by its holder `token`; the time it stamped."""
    LEDGER_TRANSITIONS.check(entry.status, to)
    stamp = time.time()
    parameters = {"key": entry.operation_key, "from_status": entry.status, "token": token, "to_status": to, "stamp": stamp,
                  **values}
    if await statement.execute(conn, parameters) != 1:
        raise StatusConflictError(
            f"ledger entry {entry.operation_key} is no longer {entry.status} under job claim {token}; not moved to {to}"
        )
    return stamp


async def claim_operation(
    conn: Connection, operation: Operation, *, token: int, now: sa.ColumnElement[float], max_attempts: int
) -> Claim:
    """Claim `operation` for the job claim `token`, in the caller's write transaction.

    Run the tool only on `ClaimKind.RUN`, and only after `start_execution` has committed.
    """
    stamp = time.time()
    first = {
        **{f: getattr(operation, f) for f in _OPERATION_COLUMNS},
        "status": _L.RESERVED,
        "holder_token": token,
        "created_at": stamp,
        "updated_at": stamp,
    }
    if await _INSERT_FIRST[conn.dialect.name].execute(conn, first) == 1:
        entry = LedgerEntry(**first, attempts=0, retry_after=None, result=None, result_blob=None, error=None, reason=None,
                            resolved_by=None, reuses=0)
        return Claim(ClaimKind.RUN, entry)
    holder_alive = sa.and_(ledger_entries.c.holder_token.is_not(None), _job_running(ledger_entries.c.holder_token, now))
    retry_due = sa.or_(ledger_entries.c.retry_after.is_(None), ledger_entries.c.retry_after <= now)
    stmt = sa.select(
        ledger_entries, holder_alive.label("holder_alive"), retry_due.label("retry_due"), now.label("now")
    ).where(ledger_entries.c.operation_key == operation.operation_key)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(of=ledger_entries)
    row = (await conn.execute(stmt)).one()
    entry = _entry(row)
    if entry.arguments_digest != operation.arguments_digest or entry.tenant != operation.tenant:
        return Claim(ClaimKind.CONFLICT, entry)
    if entry.status == _L.SUCCEEDED:
        reused = await _update(conn, entry, {"reuses": ledger_entries.c.reuses + 1})
        return Claim(ClaimKind.REUSE, reused)
    if entry.status == _L.FAILED_TERMINAL:
        return Claim(ClaimKind.FAILED, entry)
    if entry.status == _L.UNCERTAIN:
        return Claim(ClaimKind.UNCERTAIN, entry)
    if entry.holder_token == token:
        # This very claim holds it already (its pipeline runs the call again).
        return Claim(ClaimKind.PROBE if entry.status == _L.EXECUTING else ClaimKind.RUN, entry)
    if entry.status == _L.FAILED_RETRYABLE:
        if entry.attempts >= max_attempts:
            message = f"{entry.error or 'it failed'} (gave up after {entry.attempts} attempts)"
            return Claim(ClaimKind.FAILED, await _move(conn, entry, _L.FAILED_TERMINAL, None, {"error": message}))
        if not row.retry_due:
            return Claim(ClaimKind.WAIT, entry, wait_s=max(0.0, float(entry.retry_after or 0) - float(row.now)))
        return Claim(ClaimKind.RUN, await _move(conn, entry, _L.RESERVED, None, {"holder_token": token, "retry_after": None}))
    if row.holder_alive:
        return Claim(ClaimKind.WAIT, entry)
    if entry.status == _L.RESERVED:
        # Its holder died before the tool started: nothing happened, take it over.
        return Claim(ClaimKind.RUN, await _move(conn, entry, _L.RESERVED, None, {"holder_token": token}))
    # executing, holder gone: the outcome is unknown. The claimant probes; it becomes the holder
    # so that the probe's answer is fenced like any other transition.
    return Claim(ClaimKind.PROBE, await _update(conn, entry, {"holder_token": token}))


async def _update(conn: Connection, entry: LedgerEntry, values: Mapping[str, Any]) -> LedgerEntry:
    stmt = (
        sa.update(ledger_entries)
        .where(ledger_entries.c.operation_key == entry.operation_key, ledger_entries.c.status == entry.status)
        .values(**values, updated_at=time.time())
        .returning(ledger_entries)
    )
    row = (await conn.execute(stmt)).first()
    if row is None:
        raise StatusConflictError(f"ledger entry {entry.operation_key} is no longer {entry.status}")
    return _entry(row)


async def _move(
    conn: Connection, entry: LedgerEntry, to: LedgerStatus, token: int | None, values: Mapping[str, Any]
) -> LedgerEntry:
    """Move `entry` from the status it was read in to `to`; with `token`, only while that job
    claim holds the entry and its job still runs (`StatusConflictError` otherwise)."""
    LEDGER_TRANSITIONS.check(entry.status, to)
    conditions = [ledger_entries.c.operation_key == entry.operation_key, ledger_entries.c.status == entry.status]
    if token is not None:
        conditions += [ledger_entries.c.holder_token == token, _job_running(token, None)]
    stmt = (
        sa.update(ledger_entries).where(*conditions).values(**values, status=to, updated_at=time.time()).returning(ledger_entries)
    )
    row = (await conn.execute(stmt)).first()
    if row is None:
        raise StatusConflictError(
            f"ledger entry {entry.operation_key} is no longer {entry.status} under job claim {token}; not moved to {to}"
        )
    return _entry(row)


async def start_execution(conn: Connection, entry: LedgerEntry, *, token: int) -> LedgerEntry:
    """reserved → executing, committed before the tool starts: from here on a crash leaves an
    unknown outcome, never a second run."""
    stamp = await _held_move(conn, _START, entry, _L.EXECUTING, token)
    return dataclasses.replace(entry, status=_L.EXECUTING, attempts=entry.attempts + 1, updated_at=stamp)


async def reopen_entry(conn: Connection, entry: LedgerEntry, *, token: int) -> LedgerEntry:
    """executing → reserved, by its holder, when the tool's probe says the effect did not
    happen: the call may run again (it is started like a fresh reservation)."""
    return await _move(conn, entry, _L.RESERVED, token, {})


async def settle_entry(
    conn: Connection,
    entry: LedgerEntry,
    to: LedgerStatus,
    *,
    token: int,
    result: Mapping[str, Any] | None = None,
    result_blob: str | None = None,
    error: str | None = None,
    reason: str | None = None,
    retry_after: sa.ColumnElement[float] | None = None,
) -> LedgerEntry:
    """executing → succeeded | failed_retryable | failed_terminal | uncertain, by its holder."""
    values: dict[str, Any] = {"result": result, "result_blob": result_blob, "error": error, "reason": reason}
    if retry_after is not None:
        return await _move(conn, entry, to, token, {**values, "retry_after": retry_after})
    stamp = await _held_move(conn, _SETTLE, entry, to, token, **values)
    return dataclasses.replace(entry, status=to, updated_at=stamp, **values)


async def resolve_entry(
    conn: Connection,
    entry: LedgerEntry,
    *,
    by: str,
    result: Mapping[str, Any] | None = None,
    result_blob: str | None = None,
    error: str | None = None,
) -> LedgerEntry:
    """A person settles an `uncertain` entry: succeeded with `result`, or failed with `error`."""
    to = _L.SUCCEEDED if error is None else _L.FAILED_TERMINAL
    values = {"result": result, "result_blob": result_blob, "error": error, "resolved_by": by}
    return await _move(conn, entry, to, None, values)


# What a turn's end makes of an entry it left unsettled: the call will never run again.
_TURN_ENDED: dict[LedgerStatus, tuple[LedgerStatus, str, sa.ColumnElement[Any] | str]] = {
    _L.RESERVED: (_L.FAILED_TERMINAL, "error", "its turn ended before the tool started; it did not run"),
    _L.FAILED_RETRYABLE: (_L.FAILED_TERMINAL, "error", ledger_entries.c.error.concat(" (not retried: its turn ended)")),
    _L.EXECUTING: (_L.UNCERTAIN, "reason", "its turn ended while the tool ran; whether it took effect is unknown"),
}


async def close_turn_entries(conn: Connection, turn_id: str) -> int:
    """The turn ended (in the caller's transaction): its unsettled entries are settled as what
    they now are. Nothing ran of a reservation; a retry will not happen; an execution cut
    short has an unknown outcome (`uncertain`). Returns how many became uncertain."""
    uncertain = 0
    for source, (to, column, text) in _TURN_ENDED.items():
        LEDGER_TRANSITIONS.check(source, to)
        stmt = (
            sa.update(ledger_entries)
            .where(ledger_entries.c.turn_id == turn_id, ledger_entries.c.status == source)
            .values({column: text, "status": to, "holder_token": None, "retry_after": None, "updated_at": time.time()})
        )
        changed = (await conn.execute(stmt)).rowcount
        if to == _L.UNCERTAIN:
            uncertain += changed
    return uncertain


async def referenced_result_blobs(conn: Connection, digests: Sequence[str]) -> set[str]:
    """Those of `digests` that some entry stores its result in (the blob garbage collector
    keeps them)."""
    if not digests:
        return set()
    stmt = sa.select(ledger_entries.c.result_blob).where(ledger_entries.c.result_blob.in_(list(digests))).distinct()
    return {str(d) for d in (await conn.execute(stmt)).scalars()}


async def sweep_settled_entries(conn: Connection, *, settled_before: float, limit: int) -> list[str]:
    """Delete up to `limit` entries settled (succeeded, failed_terminal) before `settled_before`
    whose turn is over or gone: its calls never run again, so nothing asks for them. An
    `uncertain` entry is kept until a person resolves it. Returns the operation keys deleted
    (the data keys of their sealed results are the caller's to shred in the same transaction)."""
    turn_active = (
        sa.select(turns.c.id)
        .where(turns.c.id == ledger_entries.c.turn_id, turns.c.status.in_(_ACTIVE_TURN))
        .exists()
    )
    doomed = (
        sa.select(ledger_entries.c.operation_key)
        .where(ledger_entries.c.status.in_(_SETTLED), ledger_entries.c.updated_at < settled_before, ~turn_active)
        .limit(limit)
    )
    keys = [str(k) for k in (await conn.execute(doomed)).scalars()]
    if keys:
        await conn.execute(sa.delete(ledger_entries).where(ledger_entries.c.operation_key.in_(keys)))
    return keys


async def forget_session_results(conn: Connection, session_id: str) -> list[str]:
    """Drop the stored results of a deleted session's entries (the entries stay, as the record
    of what ran, until the retention sweep): their blobs are unreferenced, for the blob
    garbage collector. Returns the operation keys whose result was dropped (the caller shreds
    their data keys in the same transaction)."""
    stmt = (
        sa.update(ledger_entries)
        .where(ledger_entries.c.session_id == session_id, ledger_entries.c.result.is_not(None))
        .values(result=None, result_blob=None)
        .returning(ledger_entries.c.operation_key)
    )
    return [str(k) for k in (await conn.execute(stmt)).scalars().all()]


async def get_entry(conn: Connection, operation_key: str, *, tenant: str | None = None) -> LedgerEntry | None:
    stmt = sa.select(ledger_entries).where(ledger_entries.c.operation_key == operation_key)
    if tenant is not None:
        stmt = stmt.where(ledger_entries.c.tenant == tenant)
    row = (await conn.execute(stmt)).first()
    return None if row is None else _entry(row)


async def list_entries(
    conn: Connection, tenant: str, *, status: LedgerStatus | None, after: str | None, order: Order, limit: int
) -> Page[LedgerEntry]:
    """A tenant's entries, oldest first or last, optionally of one status; `after` is an operation key."""
    after_key = None
    if after is not None:
        anchor = await get_entry(conn, after, tenant=tenant)
        if anchor is None:
            raise InvalidRequestError(f"unknown operation key in `after`: {after}", param="after")
        after_key = (anchor.created_at, anchor.operation_key)
    stmt = sa.select(ledger_entries).where(ledger_entries.c.tenant == tenant)
    if status is not None:
        stmt = stmt.where(ledger_entries.c.status == status)
    key = (ledger_entries.c.created_at, ledger_entries.c.operation_key)
    page = await fetch_page(conn, stmt, key, after=after_key, order=order, limit=limit)
    return Page([_entry(r) for r in page.data], page.has_more)
