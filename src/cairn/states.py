"""The lifecycle states of sessions, turns, items, jobs and approvals, and the moves allowed
between them.

One transition table per entity says which `from → to` moves are legal. The store writes a
status only through one guarded function per entity, which checks the table before any SQL
(`IllegalTransitionError`: Cairn asked for a move that does not exist) and then updates
conditionally on the state the writer read, so that of two racing writers the second one
loses (`StatusConflictError`) instead of overwriting the first. The engine decides the
moves; the store enforces them. Both import this leaf module, which imports nothing of
Cairn's but the error tree (docs/decisions.md, "Typed states").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

from cairn.errors import IllegalTransitionError

__all__ = [
    "APPROVAL_TRANSITIONS",
    "ITEM_TRANSITIONS",
    "JOB_TRANSITIONS",
    "SESSION_TRANSITIONS",
    "TURN_TRANSITIONS",
    "ApprovalReason",
    "ApprovalStatus",
    "EnvironmentStatus",
    "ItemStatus",
    "JobStatus",
    "LEDGER_TRANSITIONS",
    "LedgerStatus",
    "SessionStatus",
    "Transitions",
    "TurnStatus",
]


class SessionStatus(StrEnum):
    """The session's status as the API shows it (spec §3.1: no other values)."""

    IDLE = "idle"
    IN_PROGRESS = "in_progress"
    REQUIRES_ACTION = "requires_action"
    FAILED = "failed"


class TurnStatus(StrEnum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    WAITING = "waiting"  # for the client's results of its own tool calls
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ItemStatus(StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    INCOMPLETE = "incomplete"  # interrupted: cancelled, failed turn, or a worker that died


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    PARKED = "parked"  # given up after too many attempts: kept for inspection, never claimed


class ApprovalStatus(StrEnum):
    """A person's decision on one held tool call (docs/approvals.md)."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    REVOKED = "revoked"
    INVALIDATED = "invalidated"  # a check at execution time failed: the call never runs


class ApprovalReason(StrEnum):
    """Why an approval ended other than by a plain decision."""

    EXPIRED = "expired"
    DISMISSED = "dismissed"  # the Agents API's `cancel` decision
    REVOKED = "revoked"  # by a person, through the API or the CLI
    DIGEST_MISMATCH = "digest_mismatch"  # the call or its record changed since it was approved
    RUN_STATE_MISMATCH = "run_state_mismatch"  # the approval's run state no longer names this call
    MIGRATION_REQUIRED = "migration_required"  # the pinned agent version is gone or changed
    APPROVER_LOST_RIGHTS = "approver_lost_rights"  # the deciding key was revoked or lost its role
    TENANT_MISMATCH = "tenant_mismatch"
    SESSION_CANCELLED = "session_cancelled"  # the turn was cancelled before the call ran
    TURN_FAILED = "turn_failed"  # the turn failed before the call ran
    SESSION_DELETED = "session_deleted"
    # Its sealed state does not open: altered, moved, its data key gone, another master key.
    STATE_DESERIALIZE_FAILURE = "state_deserialize_failure"


class LedgerStatus(StrEnum):
    """The idempotency record of one side effect (design §1, invariant 5)."""

    RESERVED = "reserved"  # claimed by a worker; the tool has not started
    EXECUTING = "executing"  # the tool may have started: its outcome is not known until recorded
    SUCCEEDED = "succeeded"
    FAILED_RETRYABLE = "failed_retryable"
    FAILED_TERMINAL = "failed_terminal"
    UNCERTAIN = "uncertain"  # the outcome cannot be known: no automatic retry, a person decides


class EnvironmentStatus(StrEnum):
    """What the session's workspace is, durably, between turns; the environment events also
    announce the passing states `pending` and `failed`."""

    READY = "ready"
    SUSPENDED = "suspended"


S = TypeVar("S", bound=StrEnum)


@dataclass(frozen=True, slots=True)
class Transitions(Generic[S]):
    """The legal moves of one entity: `moves[from]` is the set of states it may go to, and
    `initial` the states a new row may be written in."""

    entity: str
    initial: frozenset[S]
    moves: Mapping[S, frozenset[S]]

    def is_allowed(self, from_: S, to: S) -> bool:
        return to in self.moves.get(from_, frozenset())

    def check(self, from_: S, to: S) -> None:
        """Raise `IllegalTransitionError` unless `from_ → to` is in the table."""
        if not self.is_allowed(from_, to):
            raise IllegalTransitionError(f"{self.entity} cannot move from {from_} to {to}")

    def check_initial(self, status: S) -> None:
        if status not in self.initial:
            raise IllegalTransitionError(f"a new {self.entity} cannot start as {status}")

    def is_terminal(self, status: S) -> bool:
        return not self.moves.get(status)


def _table(entity: str, initial: Iterable[S], moves: Mapping[S, Iterable[S]]) -> Transitions[S]:
    return Transitions(entity, frozenset(initial), {f: frozenset(t) for f, t in moves.items()})


_S = SessionStatus
# A session starts idle, runs while it has a turn, and waits on the client between. No code
# path fails a session today: `failed` is reachable only by adding a move here on purpose.
SESSION_TRANSITIONS = _table(
    "session",
    [_S.IDLE],
    {
        _S.IDLE: [_S.IN_PROGRESS],
        _S.IN_PROGRESS: [_S.REQUIRES_ACTION, _S.IDLE],
        # Back to work when the client answered (or the next queued turn starts after a
        # cancel); idle when the waiting turn was cancelled with nothing queued behind it.
        _S.REQUIRES_ACTION: [_S.IN_PROGRESS, _S.IDLE],
    },
)

_T = TurnStatus
TURN_TRANSITIONS = _table(
    "turn",
    [_T.QUEUED],
    {
        # A queued turn is cancelled or fails (its model or workspace unusable) before it starts.
        _T.QUEUED: [_T.IN_PROGRESS, _T.FAILED, _T.CANCELLED],
        # in_progress → in_progress: a worker re-claims the turn of a worker that died (it
        # takes over the lease token; the status stays).
        _T.IN_PROGRESS: [_T.IN_PROGRESS, _T.WAITING, _T.COMPLETED, _T.FAILED, _T.CANCELLED],
        _T.WAITING: [_T.IN_PROGRESS, _T.CANCELLED],
    },
)

_I = ItemStatus
ITEM_TRANSITIONS = _table(
    "item",
    # A call that ran before it was recorded (read-only steps), and every output, are
    # stored finished.
    [_I.IN_PROGRESS, _I.COMPLETED, _I.FAILED],
    {_I.IN_PROGRESS: [_I.COMPLETED, _I.FAILED, _I.INCOMPLETE]},
)

_J = JobStatus
JOB_TRANSITIONS = _table(
    "job",
    [_J.QUEUED],
    {
        _J.QUEUED: [_J.RUNNING],
        # running → running: a job whose lease expired is claimed again (at-least-once);
        # running → queued: a worker shutting down hands it back, or a job that raised
        # waits for its retry; running → parked: it raised too often.
        _J.RUNNING: [_J.RUNNING, _J.DONE, _J.FAILED, _J.QUEUED, _J.PARKED],
    },
)

_A = ApprovalStatus
APPROVAL_TRANSITIONS = _table(
    "approval",
    [_A.PENDING],
    {
        # Every decision is a compare-and-set from pending: the first one wins.
        _A.PENDING: [_A.APPROVED, _A.REJECTED, _A.EXPIRED, _A.REVOKED, _A.INVALIDATED],
        # An approved call that has not started can still be revoked, run out of time, or
        # fail a check at execution time; once started it stays approved.
        _A.APPROVED: [_A.REVOKED, _A.EXPIRED, _A.INVALIDATED],
    },
)

_L = LedgerStatus
LEDGER_TRANSITIONS = _table(
    "ledger entry",
    [_L.RESERVED],
    {
        # reserved → reserved: a worker takes over a reservation whose holder died before
        # the tool started. reserved → failed_terminal: its turn ended before the tool
        # started (cancelled, failed); nothing ran and nothing will.
        _L.RESERVED: [_L.RESERVED, _L.EXECUTING, _L.FAILED_TERMINAL],
        # executing → executing: never (an unknown outcome is never run again); a dead
        # holder's entry is probed or becomes uncertain. executing → reserved: only on the
        # tool's own probe saying the effect did not happen, so the call may run again.
        _L.EXECUTING: [_L.RESERVED, _L.SUCCEEDED, _L.FAILED_RETRYABLE, _L.FAILED_TERMINAL, _L.UNCERTAIN],
        _L.FAILED_RETRYABLE: [_L.RESERVED, _L.FAILED_TERMINAL],
        # Only a person (or a probe's later answer through them) settles an uncertain effect.
        _L.UNCERTAIN: [_L.SUCCEEDED, _L.FAILED_TERMINAL],
    },
)
