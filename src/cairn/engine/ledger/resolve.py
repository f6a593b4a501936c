"""A person resolves an `uncertain` effect: it happened (with a result) or it did not.

Resolving is open to the tenant's `admin` and `approver` keys (the roles that decide
approvals). In one journal transaction of the entry's session, the entry moves from
`uncertain` to `succeeded` (with the given result, stored like a tool's) or
`failed_terminal` (with the given message), and the call's hold is released: the turn's job
is queued and any worker continues it, where the ledger finishes the call with what the
person said, without running the tool (design invariant 5).
"""

from __future__ import annotations

import logging

from cairn.blobs import BlobStore
from cairn.durable.sealing import Sealer
from cairn.engine.journal import Journal
from cairn.engine.ledger.results import store_output
from cairn.engine.loop.waiting import release_hold
from cairn.errors import CairnMisuseError, ConflictError, NotFoundError, PermissionDeniedError
from cairn.states import LedgerStatus
from cairn.store.approvals import Decider
from cairn.store.ledger import LedgerEntry, get_entry, resolve_entry

__all__ = ["RESOLVER_ROLES", "resolve_effect"]

log = logging.getLogger(__name__)

RESOLVER_ROLES = frozenset({"admin", "approver"})


def _not_found(operation_key: str) -> NotFoundError:
    return NotFoundError(f"No ledger entry found with operation key '{operation_key}'.", param="operation_key")


async def resolve_effect(
    journal: Journal, blobs: BlobStore, sealer: Sealer, resolver: Decider, operation_key: str, *, output: str | None = None,
    error: str | None = None, inline_bytes: int,
) -> LedgerEntry:
    """Settle the uncertain entry `operation_key` as succeeded with `output`, or failed with
    `error` (exactly one of them); returns the entry as resolved."""
    if (output is None) == (error is None):
        raise CairnMisuseError("resolve_effect takes exactly one of output and error")
    if resolver.role not in RESOLVER_ROLES:
        raise PermissionDeniedError(
            f"API key {resolver.key_id} has role {resolver.role!r}; uncertain effects are resolved by "
            f"{', '.join(sorted(RESOLVER_ROLES))}"
        )
    async with journal.db.read() as conn:
        found = await get_entry(conn, operation_key, tenant=resolver.tenant)
    if found is None:
        raise _not_found(operation_key)
    async with journal.transaction(found.session_id) as tx:
        entry = await get_entry(tx.conn, operation_key, tenant=resolver.tenant)
        if entry is None:
            raise _not_found(operation_key)
        if entry.status != LedgerStatus.UNCERTAIN:
            raise ConflictError(f"ledger entry {operation_key} is {entry.status}, not uncertain", code="ledger_entry_not_uncertain")
        result, blob = (None, None)
        if output is not None:
            result, blob = await store_output(tx.conn, blobs, sealer, entry, output, inline_bytes=inline_bytes)
        resolved = await resolve_entry(tx.conn, entry, by=resolver.key_id, result=result, result_blob=blob, error=error)
        await release_hold(tx, entry.turn_id, entry.call_id, resume_now=True)
    log.info("ledger %s: resolved as %s by key %s (role %s)", operation_key, resolved.status, resolver.key_id, resolver.role)
    return resolved
