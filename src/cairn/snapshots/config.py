"""Choosing the deployment's snapshot store from settings: local (default), s3, or none.

The only place that knows the concrete backends; the engine and the CLI see a `SnapshotStore`.
boto3 is imported only when the S3 backend is chosen, so it stays an optional dependency
(`pip install cairn[s3]`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cairn.errors import InvalidRequestError
from cairn.snapshots.base import SnapshotStore
from cairn.snapshots.content_store import ContentAddressedSnapshotStore
from cairn.snapshots.local_objects import LocalObjectStore
from cairn.snapshots.noop import NoopSnapshotStore

__all__ = ["SnapshotStoreConfig", "open_snapshot_store"]


@dataclass(frozen=True, slots=True)
class SnapshotStoreConfig:
    backend: Literal["local", "s3", "none"] = "local"
    local_root: Path | None = None
    s3_bucket: str | None = None
    s3_prefix: str = ""
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    max_workers: int | None = None


def open_snapshot_store(config: SnapshotStoreConfig) -> SnapshotStore:
    if config.backend == "none":
        return NoopSnapshotStore()
    if config.backend == "local":
        if config.local_root is None:
            raise InvalidRequestError("the local snapshot store needs a directory (local_root)", param="local_root")
        return ContentAddressedSnapshotStore(LocalObjectStore(config.local_root), max_workers=config.max_workers)
    if config.s3_bucket is None:
        raise InvalidRequestError("the s3 snapshot store needs a bucket (s3_bucket)", param="s3_bucket")
    import boto3  # type: ignore[import-untyped]

    from cairn.snapshots.s3_objects import S3ObjectStore

    client = boto3.client("s3", endpoint_url=config.s3_endpoint_url, region_name=config.s3_region)
    objects = S3ObjectStore(client, config.s3_bucket, config.s3_prefix)
    return ContentAddressedSnapshotStore(objects, max_workers=config.max_workers)
