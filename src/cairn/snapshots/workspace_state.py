"""What a workspace lifecycle remembers on local disk: the cached fingerprint and stat cache.

One file beside the workspace (never inside it, so it is not snapshotted), replaced
atomically. It is a cache: losing it costs one re-hash of the workspace, never correctness,
because reuse is decided by comparing a *freshly computed* live fingerprint (or a stat listing
of the very scan that fingerprint came from, `stat_listing`) with the stored snapshot's.
Design invariant 7 says a failed persist drops the cached fingerprint: `drop`. Read and write
failures are logged and treated as "no cache" (the `_best_effort` functions).

Format 2 is two lines of JSON: a small header (fingerprint, listing digest), then the stat
cache, which is decoded only when something needs it (`StatCache.decode_later`): a skip check
settled by the listing reads the header alone. Format 1 (one JSON document, no listing) was
only ever written with fingerprint v1, which no longer matches any new snapshot: such a file
counts as no cache (one re-hash) and is replaced by format 2 on the next save.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cairn.snapshots._fsutil import atomic_write_bytes
from cairn.snapshots.fingerprint import FINGERPRINT_VERSION
from cairn.snapshots.stat_cache import StatCache

__all__ = ["CachedFingerprint", "drop_best_effort", "load_best_effort", "save_best_effort"]

logger = logging.getLogger(__name__)

_FORMAT = 2


@dataclass(frozen=True, slots=True)
class CachedFingerprint:
    snapshot_id: str
    fingerprint: str
    fingerprint_version: str
    manifest_digest: str
    stat_cache: StatCache
    stat_listing: str | None = None
    """The listing digest of the scan `fingerprint` was computed from; None when racy or unknown."""


def load_best_effort(path: Path) -> CachedFingerprint | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        logger.warning("ignoring unreadable workspace state %s: %s", path, error)
        return None
    header, _, encoded_cache = raw.partition(b"\n")
    try:
        data: Any = json.loads(header)
        if not isinstance(data, dict):
            raise TypeError("the header is not a JSON object")
        if data.get("format") != _FORMAT or data.get("fingerprint_version") != FINGERPRINT_VERSION:
            return None
        stat_cache = StatCache.decode_later(encoded_cache)
        stat_listing = data["stat_listing"]
        if stat_listing is not None and not isinstance(stat_listing, str):
            raise TypeError("stat_listing is not a string")
        return CachedFingerprint(
            snapshot_id=str(data["snapshot_id"]),
            fingerprint=str(data["fingerprint"]),
            fingerprint_version=str(data["fingerprint_version"]),
            manifest_digest=str(data["manifest_digest"]),
            stat_cache=stat_cache,
            stat_listing=stat_listing,
        )
    except (KeyError, TypeError, ValueError) as error:
        logger.warning("ignoring malformed workspace state %s: %s", path, error)
        return None


def save_best_effort(path: Path, cached: CachedFingerprint) -> None:
    """Write the cache; a failure is logged and never fails the persist or restore it follows."""
    header = {
        "format": _FORMAT,
        "snapshot_id": cached.snapshot_id,
        "fingerprint": cached.fingerprint,
        "fingerprint_version": cached.fingerprint_version,
        "manifest_digest": cached.manifest_digest,
        "stat_listing": cached.stat_listing,
    }
    # Compact JSON escapes every control character, so the header is exactly one line.
    document = b"\n".join(
        json.dumps(part, separators=(",", ":")).encode() for part in (header, cached.stat_cache.to_json())
    )
    try:
        # Not fsynced: after a crash an old or missing cache only costs a re-hash.
        atomic_write_bytes(path, document, durable=False)
    except OSError as error:
        logger.warning("could not save workspace state %s: %s; the next start re-hashes", path, error)


def drop_best_effort(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        logger.warning("could not drop the cached fingerprint %s: %s", path, error)
