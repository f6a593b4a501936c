"""The workspace fingerprint: one digest that says "this live tree is exactly that snapshot".

`start()` skips a restore only when the live workspace's fingerprint equals the snapshot's and
both were computed with the same `FINGERPRINT_VERSION` (stored beside the value, design
invariant 7) for the same environment manifest. The fingerprint covers every entry a restore
would recreate: path, kind, mode, owner, size, content digest, sparse extents, link target,
and the mtime of files and symlinks. Directory mtimes are left out on purpose: they only move
when entries are added or removed (already covered) or when an *excluded* path changes, which
must not force a restore. Excluded paths are never part of it.

Content digests come from the stat cache (`stat_cache`), so computing a fingerprint of an
unchanged workspace reads no file contents.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from cairn.snapshots._content import hash_stored_content, stored_length
from cairn.snapshots.exclusions import Exclusions
from cairn.snapshots.models import RootMeta
from cairn.snapshots.scan import scan_workspace
from cairn.snapshots.stat_cache import StatCache

__all__ = [
    "FINGERPRINT_VERSION",
    "FingerprintedEntry",
    "LiveFingerprint",
    "compute_fingerprint",
    "environment_manifest_digest",
    "fingerprint_of_rows",
    "fingerprint_row",
    "fingerprint_workspace",
]

# Bump when anything below changes what goes into the digest; old values then never match
# (a workspace fingerprinted by an older version is restored once instead of reused).
# v1 hashed one JSON line per entry; v2 hashes one JSON document, encoded in a single C call.
FINGERPRINT_VERSION = "cairn-tree-sha256-v2"


def environment_manifest_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of a session's environment manifest (sorted keys, no spaces)."""
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


class FingerprintedEntry(Protocol):
    """What the fingerprint reads; both a stored `TreeEntry` and a live `ScannedEntry` have it."""

    @property
    def path(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def mode(self) -> int: ...
    @property
    def uid(self) -> int: ...
    @property
    def gid(self) -> int: ...
    @property
    def mtime_ns(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def digest(self) -> str | None: ...
    @property
    def extents(self) -> tuple[tuple[int, int], ...] | None: ...
    @property
    def target(self) -> str | None: ...


# ensure_ascii (the default) keeps undecodable names (surrogate escapes) hashable and unambiguous.
_encode = json.JSONEncoder(separators=(",", ":")).encode


def fingerprint_row(entry: FingerprintedEntry) -> list[Any]:
    """What the fingerprint hashes of one entry (rows are built wherever is cheapest, then hashed in order)."""
    return [
        entry.path,
        entry.kind,
        entry.mode,
        entry.uid,
        entry.gid,
        0 if entry.kind == "dir" else entry.mtime_ns,
        entry.size,
        entry.digest,
        entry.extents,  # tuples of (offset, length); JSON encodes them as arrays
        entry.target,
    ]


def compute_fingerprint(entries: Iterable[FingerprintedEntry], root: RootMeta, manifest_digest: str) -> str:
    """Digest of the tree in path order, the root's mode and owner, and the manifest digest."""
    return fingerprint_of_rows([fingerprint_row(entry) for entry in entries], root, manifest_digest)


def fingerprint_of_rows(rows: list[list[Any]], root: RootMeta, manifest_digest: str) -> str:
    """`compute_fingerprint` of the entries whose `fingerprint_row`s are `rows`, in path order.

    One JSON array holds all of it, so the encoder runs once in C instead of once per entry
    (the skip check computes this for every file of the workspace on every start).
    """
    document = [FINGERPRINT_VERSION, manifest_digest, [root.mode, root.uid, root.gid], rows]
    return hashlib.sha256(_encode(document).encode()).hexdigest()


class LiveFingerprint(NamedTuple):
    fingerprint: str
    stat_cache: StatCache
    """Refreshed: the next full check hashes nothing that stayed unchanged."""
    stat_listing: str | None
    """The scan's listing digest: the next check can recognise this tree from a stat walk."""


def fingerprint_workspace(
    workspace: Path, exclusions: Exclusions, stat_cache: StatCache, manifest_digest: str
) -> LiveFingerprint:
    """The live workspace's fingerprint, hashing only files the stat cache cannot vouch for."""
    scan = scan_workspace(workspace, exclusions, stat_cache)
    root = str(workspace)
    for entry in scan.entries:
        if entry.kind == "file" and entry.digest is None and stored_length(entry) > 0:
            entry.digest = hash_stored_content(os.path.join(root, entry.path), entry)
    fingerprint = compute_fingerprint(scan.entries, scan.root, manifest_digest)
    return LiveFingerprint(fingerprint, scan.stat_cache(), scan.stat_listing())
