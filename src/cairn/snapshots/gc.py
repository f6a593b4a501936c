"""Retention and garbage collection for a tenant's snapshots and content packs.

Two phases per run:
1. *retention*: per session keep the newest `keep_last` snapshots and any younger than
   `keep_within_s`; delete the others' headers (uncommitting them) and then their trees.
   Trees whose header never got written (a killed persist) go once older than the grace.
2. *sweep*: a pack referenced by no kept header is first *condemned* (a marker object), which
   removes it from every persist's dedup index; it is deleted only when a later run finds it
   still unreferenced after `grace_s`. A pack that a new snapshot references again is pardoned.
   Packs younger than `grace_s` are never touched: they may belong to a persist in flight.
So a blob referenced by any kept snapshot is never deleted, and a persist shorter than the
grace period never ends up referring to deleted content.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from cairn.errors import InvalidRequestError
from cairn.snapshots import layout
from cairn.snapshots.errors import ObjectMissingError, SnapshotCorruptError
from cairn.snapshots.models import SnapshotInfo
from cairn.snapshots.objects import ObjectInfo, ObjectStore

__all__ = ["GcReport", "Retention", "collect_garbage", "parse_header"]


@dataclass(frozen=True, slots=True)
class Retention:
    keep_last: int = 10
    keep_within_s: float | None = None

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise InvalidRequestError(
                "retention must keep at least the latest snapshot of each session", param="keep_last"
            )


@dataclass(frozen=True, slots=True)
class GcReport:
    snapshots_deleted: int = 0
    orphan_trees_deleted: int = 0
    packs_condemned: int = 0
    packs_pardoned: int = 0
    packs_deleted: int = 0
    bytes_freed: int = 0
    abandoned_writes_removed: int = 0


def parse_header(raw: bytes, key: str) -> SnapshotInfo:
    try:
        return SnapshotInfo.model_validate_json(raw)
    except ValueError as error:
        raise SnapshotCorruptError(f"snapshot header {key!r} is unreadable", context={"key": key}) from error


def collect_garbage(objects: ObjectStore, tenant_id: str, retention: Retention, grace_s: float) -> GcReport:
    now = time.time()
    snapshots_deleted, orphans, referenced = _apply_retention(objects, tenant_id, retention, grace_s, now)
    condemned = {
        info.key[len(layout.condemned_prefix(tenant_id)) :]: info
        for info in objects.list(layout.condemned_prefix(tenant_id))
    }
    counts = {"condemned": 0, "pardoned": 0, "deleted": 0, "freed": 0}
    packs: set[str] = set()
    for info in objects.list(layout.packs_prefix(tenant_id)):
        if not info.key.endswith(layout.PACK_SUFFIX):
            continue
        pack_id = info.key[len(layout.packs_prefix(tenant_id)) : -len(layout.PACK_SUFFIX)]
        packs.add(pack_id)
        if pack_id in referenced or now - info.modified_at < grace_s:
            continue
        marker = condemned.get(pack_id)
        if marker is None:
            objects.put_bytes(layout.condemned_key(tenant_id, pack_id), b"")
            counts["condemned"] += 1
            condemned_at = now
        else:
            condemned_at = marker.modified_at
        if now - condemned_at >= grace_s:
            objects.delete(info.key)
            objects.delete(layout.condemned_key(tenant_id, pack_id))
            counts["deleted"] += 1
            counts["freed"] += info.size
    for pack_id in condemned:
        if pack_id in referenced or pack_id not in packs:
            objects.delete(layout.condemned_key(tenant_id, pack_id))
            counts["pardoned"] += pack_id in referenced
    return GcReport(
        snapshots_deleted=snapshots_deleted,
        orphan_trees_deleted=orphans,
        packs_condemned=counts["condemned"],
        packs_pardoned=counts["pardoned"],
        packs_deleted=counts["deleted"],
        bytes_freed=counts["freed"],
        abandoned_writes_removed=objects.sweep_abandoned(grace_s),
    )


def _apply_retention(
    objects: ObjectStore, tenant_id: str, retention: Retention, grace_s: float, now: float
) -> tuple[int, int, set[str]]:
    """Delete what retention drops; return (snapshots deleted, orphan trees deleted, packs kept)."""
    prefix = layout.sessions_prefix(tenant_id)
    headers: dict[str, list[ObjectInfo]] = defaultdict(list)
    trees: dict[str, dict[str, ObjectInfo]] = defaultdict(dict)
    for info in objects.list(prefix):
        session, _, name = info.key[len(prefix) :].partition("/")
        if name.endswith(layout.HEADER_SUFFIX):
            headers[session].append(info)
        elif name.endswith(layout.TREE_SUFFIX):
            trees[session][name[: -len(layout.TREE_SUFFIX)]] = info
    referenced: set[str] = set()
    deleted = orphans = 0
    for session in sorted(set(headers) | set(trees)):
        # Snapshot ids sort by creation time (ids.new_snapshot_id), so the newest are last.
        ordered = sorted(headers[session], key=lambda info: info.key)
        keep_from = len(ordered) - retention.keep_last
        kept_ids: set[str] = set()
        for position, info in enumerate(ordered):
            snapshot_id = info.key.rsplit("/", 1)[1][: -len(layout.HEADER_SUFFIX)]
            is_recent = retention.keep_within_s is not None and now - info.modified_at < retention.keep_within_s
            if position >= keep_from or is_recent:
                try:
                    header = parse_header(objects.get_bytes(info.key), info.key)
                except ObjectMissingError:
                    continue  # deleted by a concurrent collection
                referenced.update(header.packs)
                kept_ids.add(snapshot_id)
                continue
            objects.delete(info.key)
            tree = trees[session].get(snapshot_id)
            if tree is not None:
                objects.delete(tree.key)
            kept_ids.add(snapshot_id)  # its tree is handled; not an orphan
            deleted += 1
        for snapshot_id, tree in trees[session].items():
            if snapshot_id not in kept_ids and now - tree.modified_at >= grace_s:
                objects.delete(tree.key)
                orphans += 1
    return deleted, orphans, referenced
