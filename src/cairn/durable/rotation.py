"""Rotating the master key (`cairn secrets rotate-master`): every stored data key is re-wrapped
with the new version; the wrapped keys change, the sealed blobs do not.

`rotate_master` first checks that this keyring opens what the database holds (run with
another data dir or another `CAIRN_MASTER_KEY` than the server's, it would otherwise rotate
keys nobody uses). With the key file, it adds a new version, re-wraps, waits until every
process on the data dir has looked at the file again (`RELOAD_INTERVAL_S`), re-wraps what
was sealed under the old version meanwhile, and only then drops the old versions: until
then they still open what they wrapped. With keys from the environment, the new version is
already there (the operator added it); it re-wraps, and reports which old versions no data
key uses any more, for the operator to remove.

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

import anyio

from cairn._concurrency import run_sync
from cairn.durable.crypto import DataKey, Envelope, SealScope, WrappedKey, key_context
from cairn.durable.keyring import RELOAD_INTERVAL_S, LocalKeyring
from cairn.errors import CairnError, StateDeserializeError
from cairn.store.data_keys import count_by_version, first_key_at, keys_not_at, set_wrapped
from cairn.store.db import Database

__all__ = ["RewrapReport", "RotationReport", "check_keyring", "rewrap_data_keys", "rotate_master"]

# How long `rotate_master` waits before dropping old versions: longer than the interval at
# which other processes look at the key file.
SETTLE_S = 3 * RELOAD_INTERVAL_S

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


@dataclass(slots=True)
class RotationReport:
    source: str
    previous_versions: list[int]
    version: int
    rewrapped: int
    unreadable: list[str]
    # Versions removed from the key file, or (keys from the environment) no longer used by
    # any data key: the operator removes them.
    dropped_versions: list[int]
    unused_versions: list[int]
    data_keys_by_version: dict[int, int]


async def check_keyring(db: Database, keyring: LocalKeyring) -> None:
    """Refuse a keyring that does not open the data keys the database holds: for each master
    key version in use, one of its data keys must unwrap."""
    async with db.read() as conn:
        in_use = await count_by_version(conn)
        samples = [await first_key_at(conn, version) for version in sorted(in_use)]
    for sample in samples:
        if sample is None:
            continue
        scope = SealScope(sample.tenant, sample.kind, sample.record_id)
        try:
            await keyring.unwrap(WrappedKey(sample.key_version, sample.wrapped), key_context(scope, sample.id))
        except StateDeserializeError as exc:
            raise CairnError(
                f"the master keys of {keyring.source} do not open the data keys in this database ({exc.message}); "
                "run with the data dir or the CAIRN_MASTER_KEY the server uses",
                code="wrong_master_key",
            ) from exc


async def rotate_master(db: Database, keyring: LocalKeyring, *, settle_s: float = SETTLE_S) -> RotationReport:
    """Rotate to a new master key version (the key file) or to the highest one given (the
    environment), re-wrapping every data key; see the module's docstring."""
    await check_keyring(db, keyring)
    previous = keyring.versions()
    if keyring.is_file:
        await run_sync(keyring.add_version)
    envelope = Envelope(keyring)
    report = await rewrap_data_keys(db, envelope)
    dropped: list[int] = []
    if keyring.is_file:
        await anyio.sleep(settle_s)
        late = await rewrap_data_keys(db, envelope)
        report.rewrapped += late.rewrapped
        report.unreadable += late.unreadable
        dropped = await run_sync(keyring.drop_versions_below, report.version)
    async with db.read() as conn:
        in_use = await count_by_version(conn)
    log.info("master key rotated to version %d: %d data keys re-wrapped", report.version, report.rewrapped)
    return RotationReport(
        source=keyring.source,
        previous_versions=previous,
        version=report.version,
        rewrapped=report.rewrapped,
        unreadable=report.unreadable,
        dropped_versions=dropped,
        unused_versions=[v for v in keyring.versions() if v != report.version and v not in in_use],
        data_keys_by_version=in_use,
    )
