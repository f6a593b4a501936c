"""Every snapshot backend runs this whole suite: the local directory and S3 (moto's S3,
driven by the real boto3 client code). Tests make their own tenant and session ids.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from cairn.snapshots import ContentAddressedSnapshotStore, LocalObjectStore, ObjectStore
from cairn.snapshots.s3_objects import S3ObjectStore

BACKENDS = ("local", "s3")


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"debug": True})


@pytest.fixture(params=BACKENDS)
def objects(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ObjectStore]:
    if request.param == "local":
        yield LocalObjectStore(tmp_path / "store")
        return
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="cairn-snapshots")
        # A small part size makes the multipart path run on test-sized files.
        yield S3ObjectStore(client, "cairn-snapshots", prefix="deployment-a", part_size=5 * 1024 * 1024)


@pytest.fixture
async def store(objects: ObjectStore) -> AsyncIterator[ContentAddressedSnapshotStore]:
    snapshot_store = ContentAddressedSnapshotStore(objects, max_workers=2)
    yield snapshot_store
    await snapshot_store.aclose()
