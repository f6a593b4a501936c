"""Where each document of a content-addressed snapshot store lives, as object keys.

    tenants/<tenant>/packs/<pack_id>.pack            blobs + index trailer (content, shared per tenant)
    tenants/<tenant>/condemned/<pack_id>             garbage-collection mark of an unreferenced pack
    tenants/<tenant>/sessions/<session>/<id>.tree    one JSON line per workspace entry
    tenants/<tenant>/sessions/<session>/<id>.json    the header; written last, the commit point

Every segment is validated (`ids.validate_segment`) before it reaches this module, so a key
can never climb out of its prefix on disk or in a bucket.
"""

from __future__ import annotations

from cairn.snapshots.ids import SnapshotScope

__all__ = [
    "HEADER_SUFFIX",
    "PACK_SUFFIX",
    "TREE_SUFFIX",
    "condemned_key",
    "condemned_prefix",
    "header_key",
    "pack_key",
    "packs_prefix",
    "session_prefix",
    "sessions_prefix",
    "tree_key",
]

PACK_SUFFIX = ".pack"
TREE_SUFFIX = ".tree"
HEADER_SUFFIX = ".json"


def packs_prefix(tenant_id: str) -> str:
    return f"tenants/{tenant_id}/packs/"


def pack_key(tenant_id: str, pack_id: str) -> str:
    return f"{packs_prefix(tenant_id)}{pack_id}{PACK_SUFFIX}"


def condemned_prefix(tenant_id: str) -> str:
    return f"tenants/{tenant_id}/condemned/"


def condemned_key(tenant_id: str, pack_id: str) -> str:
    return f"{condemned_prefix(tenant_id)}{pack_id}"


def sessions_prefix(tenant_id: str) -> str:
    return f"tenants/{tenant_id}/sessions/"


def session_prefix(scope: SnapshotScope) -> str:
    return f"{sessions_prefix(scope.tenant_id)}{scope.session_id}/"


def tree_key(scope: SnapshotScope, snapshot_id: str) -> str:
    return f"{session_prefix(scope)}{snapshot_id}{TREE_SUFFIX}"


def header_key(scope: SnapshotScope, snapshot_id: str) -> str:
    return f"{session_prefix(scope)}{snapshot_id}{HEADER_SUFFIX}"
