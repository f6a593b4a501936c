"""Re-wrapping the stored data keys with the current master key version (`cairn secrets
rotate-master`): the wrapped keys change, the sealed blobs do not.

One pass goes through the data keys not wrapped by the current version, in id order, a batch
at a time: each is unwrapped by the version that wrapped it and wrapped again by the current
one, off any transaction, then stored by a compare-and-set on the version it was read with
(a key deleted or re-wrapped meanwhile is left alone). Sealing goes on meanwhile: a process
that still wraps with an older version leaves a key the next pass finds. A key no version
of the keyring unwraps cannot be re-wrapped; it is reported, not retried (its blob was
unreadable before the rotation too).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from cairn.durable.crypto import DataKey, Envelope, SealScope, WrappedKey
from cairn.errors import StateDeserializeError
from cairn.store.data_keys import keys_not_at, set_wrapped
from cairn.store.db import Database

__all__ = ["RewrapReport", "rewrap_data_keys"]

log = logging.getLogger(__name__)

_BATCH = 500


@dataclass(slots=True)
class RewrapReport:
    version: int
    rewrapped: int = 0
    # Data keys that no master key of the keyring unwraps (ids only).
    unreadable: list[str] = field(default_factory=list)


async def rewrap_data_keys(db: Database, envelope: Envelope, *, batch: int = _BATCH) -> RewrapReport:
    """One pass over the data keys not wrapped by the current master key version."""
    report = RewrapReport(version=envelope.keys.current_version())
    after: str | None = None
    while True:
        async with db.read() as conn:
            found = await keys_not_at(conn, report.version, after=after, limit=batch)
        if not found:
            return report
        after = found[-1].id
        rewrapped: list[tuple[int, WrappedKey]] = []
        for index, record in enumerate(found):
            scope = SealScope(record.tenant, record.kind, record.record_id)
            try:
                key = await envelope.rewrap(DataKey(record.id, WrappedKey(record.key_version, record.wrapped)), scope)
            except StateDeserializeError as exc:
                log.warning("data key %s (%s) cannot be re-wrapped: %s", record.id, scope.describe(), exc.message)
                report.unreadable.append(record.id)
                continue
            rewrapped.append((index, key))
        async with db.write() as conn:
            for index, key in rewrapped:
                if await set_wrapped(conn, found[index], key.version, key.wrapped):
                    report.rewrapped += 1
