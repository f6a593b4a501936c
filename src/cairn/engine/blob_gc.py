"""Blob garbage collection: frees artifact content that no artifact row references (nor a
ledger entry, whose large results are blobs too: `cairn.engine.ledger.results`).

Deleting an artifact, or a session with its artifacts, deletes rows only; the bytes live in
the content-addressed blob store, where one blob serves every artifact with that content
in any session of any tenant. A sweep deletes a blob once no row references it and it was
last stored more than `grace_s` ago, and deletes temporary files (`.incoming-*` writes a
crash abandoned) after the same grace.

The race with publishing. A turn stores its outputs' blobs first and inserts their rows
later (`cairn.engine.artifacts`); in between, nothing references the content. A grace
period alone cannot close that race: a sweep could check a blob's age and references,
then delete it just as a turn stores the same content again and records a row for it. Two
mechanisms make sure a committed row never points at missing bytes:
1. the sweep lock (`cairn.store.blob_locks`): a sweep checks references and moves blobs
   aside holding it exclusively; a publish holds it shared while it checks that its blobs
   exist and inserts its rows. Either the publish commits first and the sweep sees its
   rows, or the sweep moves first and the publish sees what it took, so it never records
   a row for missing content.
2. moving aside before deleting (`BlobStore.condemn`): under the lock a sweep renames the
   blob away and checks the age of exactly the copy it took; a young one goes back. A
   turn that stores the same content again at any moment keeps its own, new copy.
Several servers may sweep one directory at once: the lock orders their moves, and what one
took the other finds gone. Ages are read on the directory's own clock (`BlobStore.clock`),
so machines sharing it over a network file system agree on them.
The grace period keeps a publish from *failing*: a blob stored less than `grace_s` before
its row is recorded is always still there. A publish slower than that may find its blob
collected and then fails its turn with `BlobStoreError` instead of recording the row.
So `grace_s=0` is safe for stored data, but fails turns that are publishing right then.

Scale: the directory is read one prefix directory at a time, keeping only digests and
sizes; references are looked up in batches of 500 on the indexed `sha256` column, first
without the lock, then again under it for the few that look unreferenced; no blob is ever
read, and no table is ever loaded whole. File work runs in worker threads. The lock is held
only to re-check a batch and rename its blobs; the unlinks happen after it is released.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from cairn._concurrency import run_sync
from cairn.blobs import BlobFile, BlobStore
from cairn.config import check_seconds
from cairn.engine.runtime import Runtime
from cairn.errors import BlobStoreError, CairnError
from cairn.store.artifacts import referenced_digests
from cairn.store.blob_locks import hold_sweep_lock
from cairn.store.db import Connection, Database
from cairn.store.ledger import referenced_result_blobs

__all__ = ["BlobGcReport", "collect_blob_garbage", "sweep_blob_garbage"]

log = logging.getLogger(__name__)

_BATCH = 500

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BlobGcReport:
    """What one sweep did; in a dry run, what it would have deleted."""

    dry_run: bool = False
    blobs_scanned: int = 0
    blobs_deleted: int = 0
    temp_files_removed: int = 0
    bytes_freed: int = 0
    # Files that could not be moved, put back or deleted (each logged as a warning).
    failures: int = 0


@dataclass(slots=True)
class _Tally:
    dry_run: bool
    scanned: int = 0
    deleted: int = 0
    temp_removed: int = 0
    freed: int = 0
    failures: int = 0

    def report(self) -> BlobGcReport:
        return BlobGcReport(self.dry_run, self.scanned, self.deleted, self.temp_removed, self.freed, self.failures)


async def collect_blob_garbage(db: Database, blobs: BlobStore, *, grace_s: float, dry_run: bool = False) -> BlobGcReport:
    """One sweep of the whole blob directory (the argument for its safety: module docstring)."""
    check_seconds(grace_s, "grace_s")
    tally = _Tally(dry_run)
    survey = await run_sync(blobs.survey)
    if survey is None:
        return tally.report()
    cutoff = await run_sync(blobs.clock) - grace_s
    await _remove(blobs, [f for f in survey.incoming if f.mtime < cutoff], tally, temporary=True)
    if survey.condemned:
        await _settle_leftovers(db, blobs, survey.condemned, cutoff, tally)
    # Old blobs of several prefix directories fill one batch: a lookup per directory would
    # cost more than the lookups themselves on a sparse store.
    pending: dict[str, int] = {}  # digest -> size
    for prefix in survey.prefixes:
        try:
            count, old = await run_sync(blobs.scan_prefix, prefix, cutoff)
        except BlobStoreError as exc:
            log.warning("blob sweep skipped %s: %s", prefix, exc.message)
            tally.failures += 1
            continue
        tally.scanned += count
        pending |= old
        while len(pending) >= _BATCH:
            batch = list(itertools.islice(pending, _BATCH))
            await _sweep(db, blobs, {d: pending.pop(d) for d in batch}, cutoff, tally)
    if pending:
        await _sweep(db, blobs, pending, cutoff, tally)
    return tally.report()


async def _referenced(conn: Connection, digests: list[str]) -> set[str]:
    """Those of `digests` an artifact or a ledger entry references."""
    found = await referenced_digests(conn, digests)
    return found | await referenced_result_blobs(conn, [d for d in digests if d not in found])


async def _sweep(db: Database, blobs: BlobStore, batch: dict[str, int], cutoff: float, tally: _Tally) -> None:
    """Delete the blobs of one batch (digest -> size) that no artifact references."""
    # Most old blobs are referenced: rule them out without the lock, so it is held only
    # for the re-check of the few that remain.
    async with db.read() as conn:
        referenced = await _referenced(conn, list(batch))
    candidates = [d for d in batch if d not in referenced]
    if not candidates:
        return
    if tally.dry_run:
        tally.deleted += len(candidates)
        tally.freed += sum(batch[d] for d in candidates)
        return
    async with db.write() as conn:
        await hold_sweep_lock(conn)
        referenced = await _referenced(conn, candidates)
        digests = [d for d in candidates if d not in referenced]
        doomed, failures = await run_sync(_each_best_effort, partial(blobs.condemn, cutoff=cutoff), digests)
    tally.failures += failures
    await _remove(blobs, doomed, tally, temporary=False)


async def _settle_leftovers(db: Database, blobs: BlobStore, leftovers: list[BlobFile], cutoff: float, tally: _Tally) -> None:
    """Blobs a sweep moved aside and neither deleted nor put back: it died, or a put-back failed."""
    if tally.dry_run:
        await _remove(blobs, [f for f in leftovers if f.mtime < cutoff], tally, temporary=True)
        return
    # Under the lock: a young leftover may be a copy a publish in flight is counting on.
    async with db.write() as conn:
        await hold_sweep_lock(conn)
        doomed, failures = await run_sync(_each_best_effort, partial(blobs.settle, cutoff=cutoff), leftovers)
    tally.failures += failures
    await _remove(blobs, doomed, tally, temporary=True)


async def _remove(blobs: BlobStore, doomed: list[BlobFile], tally: _Tally, *, temporary: bool) -> None:
    if not doomed:
        return
    if tally.dry_run:
        deleted = doomed
    else:
        deleted, failures = await run_sync(_each_best_effort, partial(_delete, blobs), doomed)
        tally.failures += failures
    if temporary:
        tally.temp_removed += len(deleted)
    else:
        tally.deleted += len(deleted)
    tally.freed += sum(f.size for f in deleted)


def _each_best_effort(action: Callable[[T], BlobFile | None], items: Sequence[T]) -> tuple[list[BlobFile], int]:
    """Apply a file action to each item: the files it returned, and how many times it failed
    (each logged as a warning; what failed is left for the next sweep)."""
    results, failures = [], 0
    for item in items:
        try:
            result = action(item)
        except BlobStoreError as exc:
            log.warning("blob sweep: %s", exc.message)
            failures += 1
            continue
        if result is not None:
            results.append(result)
    return results, failures


def _delete(blobs: BlobStore, found: BlobFile) -> BlobFile | None:
    # Counted only when this sweep deleted it, not another sweep first.
    return found if blobs.delete(found) else None


async def sweep_blob_garbage(rt: Runtime) -> None:
    """One periodic sweep with the deployment's grace period; a failed sweep is logged and the
    next one tries again."""
    try:
        report = await collect_blob_garbage(rt.db, rt.blobs, grace_s=rt.settings.blob_gc_grace_s)
    except CairnError as exc:
        log.warning("blob garbage collection failed: %s", exc.message)
        return
    if report.blobs_deleted or report.temp_files_removed or report.failures:
        log.info("blob gc: %s", report)
