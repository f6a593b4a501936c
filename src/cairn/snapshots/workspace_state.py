"""What a workspace lifecycle remembers on local disk: the cached fingerprint and stat cache.

One JSON file beside the workspace (never inside it, so it is not snapshotted), replaced
atomically. It is a cache: losing it costs one re-hash of the workspace, never correctness,
because reuse is decided by comparing a *freshly computed* live fingerprint with the stored
snapshot's. Design invariant 7 says a failed persist drops the cached fingerprint: `drop`.
Read and write failures are logged and treated as "no cache" (the `_best_effort` functions).
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

_FORMAT = 1


@dataclass(frozen=True, slots=True)
class CachedFingerprint:
    snapshot_id: str
    fingerprint: str
    fingerprint_version: str
    manifest_digest: str
    stat_cache: StatCache


def load_best_effort(path: Path) -> CachedFingerprint | None:
    try:
        data: dict[str, Any] = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        logger.warning("ignoring unreadable workspace state %s: %s", path, error)
        return None
    try:
        if data.get("format") != _FORMAT or data.get("fingerprint_version") != FINGERPRINT_VERSION:
            return None
        return CachedFingerprint(
            snapshot_id=str(data["snapshot_id"]),
            fingerprint=str(data["fingerprint"]),
            fingerprint_version=str(data["fingerprint_version"]),
            manifest_digest=str(data["manifest_digest"]),
            stat_cache=StatCache.from_json(data["stat_cache"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        logger.warning("ignoring malformed workspace state %s: %s", path, error)
        return None


def save_best_effort(path: Path, cached: CachedFingerprint) -> None:
    """Write the cache; a failure is logged and never fails the persist or restore it follows."""
    document = {
        "format": _FORMAT,
        "snapshot_id": cached.snapshot_id,
        "fingerprint": cached.fingerprint,
        "fingerprint_version": cached.fingerprint_version,
        "manifest_digest": cached.manifest_digest,
        "stat_cache": cached.stat_cache.to_json(),
    }
    try:
        # Not fsynced: after a crash an old or missing cache only costs a re-hash.
        atomic_write_bytes(path, json.dumps(document, separators=(",", ":")).encode(), durable=False)
    except OSError as error:
        logger.warning("could not save workspace state %s: %s; the next start re-hashes", path, error)


def drop_best_effort(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        logger.warning("could not drop the cached fingerprint %s: %s", path, error)
