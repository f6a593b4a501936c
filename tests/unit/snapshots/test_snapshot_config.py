"""`open_snapshot_store` picks the deployment's backend from settings."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from cairn.errors import InvalidRequestError
from cairn.snapshots import (
    ContentAddressedSnapshotStore,
    NoopSnapshotStore,
    PersistRequest,
    SnapshotScope,
    SnapshotStoreConfig,
    open_snapshot_store,
)
from cairn.snapshots.s3_objects import S3ObjectStore

pytestmark = pytest.mark.anyio


async def test_none_local_and_misconfigured(tmp_path: Path) -> None:
    assert isinstance(open_snapshot_store(SnapshotStoreConfig(backend="none")), NoopSnapshotStore)
    local = open_snapshot_store(SnapshotStoreConfig(local_root=tmp_path))
    assert isinstance(local, ContentAddressedSnapshotStore)
    await local.aclose()
    with pytest.raises(InvalidRequestError):
        open_snapshot_store(SnapshotStoreConfig(backend="local"))
    with pytest.raises(InvalidRequestError):
        open_snapshot_store(SnapshotStoreConfig(backend="s3"))


async def test_s3_backend_persists_through_boto3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bucket")
        store = open_snapshot_store(
            SnapshotStoreConfig(backend="s3", s3_bucket="bucket", s3_prefix="cairn", s3_region="us-east-1")
        )
        assert isinstance(store, ContentAddressedSnapshotStore) and isinstance(store.objects, S3ObjectStore)
        workspace = tmp_path / "ws"
        workspace.mkdir()
        (workspace / "file").write_text("hello")
        scope = SnapshotScope("tenant", "session")
        result = await store.persist(PersistRequest(scope=scope, workspace=workspace, manifest_digest="m"))
        assert result is not None
        keys = [item["Key"] for item in boto3.client("s3", region_name="us-east-1").list_objects_v2(Bucket="bucket")["Contents"]]
        assert all(key.startswith("cairn/tenants/tenant/") for key in keys)
        assert await store.latest(scope) == result.snapshot
        await store.aclose()
