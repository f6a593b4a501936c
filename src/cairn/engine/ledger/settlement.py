"""Settling a running call's ledger entry with the call's result.

A call the ledger let run (or whose probe said it happened) carries a `LedgerSettlement`.
When the call has a result:

- a retryable failure (`cairn.RetryableToolError`) with attempts left moves the entry to
  `failed_retryable` with its retry time, in its own fenced transaction, and defers the call:
  it stays open and unrecorded, and the turn's job comes back after the backoff;
- anything else settles the entry (`succeeded` with the output, `failed_terminal` with the
  error) inside the transaction that records the call's result, fenced by the same job
  claim: the entry is settled if and only if the result is recorded, and a worker that lost
  its lease does neither.

`Reused` marks a call finished with what its entry already held; it settles nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cairn.blobs import BlobStore
from cairn.config import Settings
from cairn.durable.sealing import Sealer
from cairn.engine.journal import Transaction
from cairn.engine.ledger.results import store_output
from cairn.engine.tools.base import ToolResult
from cairn.engine.tools.pipeline import Defer, Settlement
from cairn.states import LedgerStatus
from cairn.store.db import Database
from cairn.store.ledger import LedgerEntry, settle_entry

__all__ = ["LedgerSettlement", "Reused", "retry_delay_s"]

_MAX_RETRY_DELAY_S = 300.0
# A stored error is for a person to read; the call's item keeps it whole.
_MAX_ERROR_CHARS = 4000


def retry_delay_s(settings: Settings, attempts: int) -> float:
    """The backoff before retry number `attempts` + 1: the first delay, doubling, capped."""
    return float(min(settings.ledger_retry_delay_s * 2 ** max(attempts - 1, 0), _MAX_RETRY_DELAY_S))


def _clip(error: str) -> str:
    return error if len(error) <= _MAX_ERROR_CHARS else error[:_MAX_ERROR_CHARS] + " […]"


@dataclass(frozen=True, slots=True)
class Reused(Settlement):
    """The call finished with its entry's stored result or error; the tool did not run."""

    operation_key: str

    @property
    def item_fields(self) -> Mapping[str, Any]:
        return {"ledger": {"operation_key": self.operation_key, "reused": True}}


class LedgerSettlement(Settlement):
    """The entry of a call this job claim runs (status `executing`, held by `token`)."""

    def __init__(
        self, db: Database, blobs: BlobStore, sealer: Sealer, settings: Settings, entry: LedgerEntry, *, token: int,
        max_attempts: int, probed: bool = False,
    ) -> None:
        self._db = db
        self._blobs = blobs
        self._sealer = sealer
        self._settings = settings
        self.entry = entry
        self._token = token
        self._max_attempts = max_attempts
        self._probed = probed

    @property
    def item_fields(self) -> Mapping[str, Any]:
        shown: dict[str, Any] = {"operation_key": self.entry.operation_key, "reused": False, "attempts": self.entry.attempts}
        if self._probed:
            shown["probed"] = True
        return {"ledger": shown}

    async def defer(self, result: ToolResult) -> Defer | None:
        entry = self.entry
        if result.error is None or not result.retryable or entry.attempts >= self._max_attempts:
            return None
        delay_s = retry_delay_s(self._settings, entry.attempts)
        async with self._db.write() as conn:
            self.entry = await settle_entry(
                conn, entry, LedgerStatus.FAILED_RETRYABLE, token=self._token, error=_clip(result.error),
                retry_after=self._db.now() + delay_s,
            )
        reason = (f"{entry.tool_name} failed ({result.error}); attempt {entry.attempts + 1} of {self._max_attempts} "
                  f"in {delay_s:g} s")
        return Defer(delay_s, reason)

    async def settle(self, tx: Transaction, result: ToolResult) -> None:
        entry = self.entry
        if result.error is None:
            stored, blob = await store_output(
                tx.conn, self._blobs, self._sealer, entry, result.output or "",
                inline_bytes=self._settings.ledger_result_inline_bytes,
            )
            self.entry = await settle_entry(tx.conn, entry, LedgerStatus.SUCCEEDED, token=self._token, result=stored, result_blob=blob)
            return
        error = result.error
        if result.retryable:
            error = f"{error} (gave up after {entry.attempts} attempts)"
        self.entry = await settle_entry(tx.conn, entry, LedgerStatus.FAILED_TERMINAL, token=self._token, error=_clip(error))
