"""A ledger entry as the API and the CLI show it (`object: "ledger_entry"`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cairn.store.ledger import LedgerEntry

__all__ = ["render_entry"]


def render_entry(entry: LedgerEntry, result: Mapping[str, Any] | None) -> dict[str, Any]:
    """Everything a person resolving an effect needs, with its result as opened for showing
    (`cairn.engine.ledger.results.shown_result`); the holder's token is internal."""
    return {
        "id": entry.operation_key,
        "object": "ledger_entry",
        "operation_key": entry.operation_key,
        "status": entry.status,
        "tool_name": entry.tool_name,
        "session_id": entry.session_id,
        "turn_id": entry.turn_id,
        "call_id": entry.call_id,
        "approval_id": entry.approval_id,
        "arguments_digest": entry.arguments_digest,
        "attempts": entry.attempts,
        "reuses": entry.reuses,
        "result": result,
        "error": entry.error,
        "reason": entry.reason,
        "resolved_by": entry.resolved_by,
        "retry_after": entry.retry_after,
        "created_at": int(entry.created_at),
        "updated_at": int(entry.updated_at),
    }
