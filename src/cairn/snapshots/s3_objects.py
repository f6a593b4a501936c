"""`ObjectStore` on an S3-compatible bucket (AWS S3, MinIO, Ceph RGW, moto in tests).

An object appears whole or not at all: small objects are one PUT, larger ones a multipart
upload that only becomes visible on `CompleteMultipartUpload`, so a killed writer leaves at
most an incomplete upload, which `sweep_abandoned` aborts. Memory stays bounded by one part
(`part_size`). boto and botocore exceptions never leave this module (style: errors).

boto3 ships no type information, so the client is typed `Any` here and nowhere else.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, NoReturn

from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

from cairn.snapshots.errors import ObjectMissingError, SnapshotStoreUnavailableError
from cairn.snapshots.objects import ObjectInfo, ObjectReader, ObjectStore, ObjectWriter

__all__ = ["S3ObjectStore"]

# S3 requires every part but the last to be at least 5 MiB.
DEFAULT_PART_SIZE = 8 * 1024 * 1024
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}


def _raise_translated(action: str, key: str, error: Exception) -> NoReturn:
    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code in _MISSING_CODES:
            raise ObjectMissingError(
                f"snapshot store: object {key!r} is missing", context={"key": key}
            ) from error
        raise SnapshotStoreUnavailableError(
            f"snapshot store: cannot {action} {key!r}: S3 error {code}",
            context={"key": key, "s3_code": code},
        ) from error
    raise SnapshotStoreUnavailableError(
        f"snapshot store: cannot {action} {key!r}: {error}", context={"key": key}
    ) from error


class _S3Writer(ObjectWriter):
    def __init__(self, client: Any, bucket: str, key: str, part_size: int) -> None:
        super().__init__()
        self._client = client
        self._bucket = bucket
        self._key = key
        self._part_size = part_size
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []

    def _write(self, data: bytes | memoryview) -> None:
        self._buffer += data
        while len(self._buffer) >= self._part_size:
            part = bytes(self._buffer[: self._part_size])
            del self._buffer[: self._part_size]
            self._upload_part(part)

    def _upload_part(self, part: bytes) -> None:
        try:
            if self._upload_id is None:
                created = self._client.create_multipart_upload(Bucket=self._bucket, Key=self._key)
                self._upload_id = str(created["UploadId"])
            number = len(self._parts) + 1
            uploaded = self._client.upload_part(
                Bucket=self._bucket,
                Key=self._key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=part,
            )
        except (BotoCoreError, ClientError) as error:
            self._abort()
            _raise_translated("upload", self._key, error)
        self._parts.append({"PartNumber": number, "ETag": uploaded["ETag"]})

    def _commit(self) -> None:
        try:
            if self._upload_id is None:
                self._client.put_object(Bucket=self._bucket, Key=self._key, Body=bytes(self._buffer))
            else:
                if self._buffer:
                    self._upload_part(bytes(self._buffer))
                self._client.complete_multipart_upload(
                    Bucket=self._bucket,
                    Key=self._key,
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": self._parts},
                )
        except (BotoCoreError, ClientError) as error:
            self._abort()
            _raise_translated("commit", self._key, error)
        finally:
            self._buffer = bytearray()

    def _abort(self) -> None:
        self._buffer = bytearray()
        if self._upload_id is None:
            return
        upload_id, self._upload_id = self._upload_id, None
        try:
            self._client.abort_multipart_upload(Bucket=self._bucket, Key=self._key, UploadId=upload_id)
        except (BotoCoreError, ClientError) as error:
            _raise_translated("abort the upload of", self._key, error)


class _BodyReader:
    """Adapts a botocore StreamingBody to `ObjectReader`, translating read errors."""

    def __init__(self, body: Any, key: str) -> None:
        self._body = body
        self._key = key

    def read(self, size: int = -1, /) -> bytes:
        try:
            data: bytes = self._body.read(None if size < 0 else size)
        except (BotoCoreError, ClientError, OSError) as error:
            _raise_translated("read", self._key, error)
        return data

    def close(self) -> None:
        self._body.close()


class S3ObjectStore(ObjectStore):
    name = "s3"

    def __init__(self, client: Any, bucket: str, prefix: str = "", part_size: int = DEFAULT_PART_SIZE) -> None:
        self._client = client
        self._bucket = bucket
        self._prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self._part_size = part_size

    def open_writer(self, key: str, *, size_hint: int | None = None) -> ObjectWriter:
        return _S3Writer(self._client, self._bucket, self._prefix + key, self._part_size)

    def open_reader(self, key: str, offset: int = 0, length: int | None = None) -> ObjectReader:
        request: dict[str, Any] = {"Bucket": self._bucket, "Key": self._prefix + key}
        if length == 0:
            return _BodyReader(_EmptyBody(), key)
        if offset or length is not None:
            end = "" if length is None else str(offset + length - 1)
            request["Range"] = f"bytes={offset}-{end}"
        try:
            response = self._client.get_object(**request)
        except (BotoCoreError, ClientError) as error:
            _raise_translated("read", key, error)
        return _BodyReader(response["Body"], key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        paginator = self._client.get_paginator("list_objects_v2")
        strip = len(self._prefix)
        try:
            for page in paginator.paginate(Bucket=self._bucket, Prefix=self._prefix + prefix):
                for item in page.get("Contents", []):
                    yield ObjectInfo(
                        key=str(item["Key"])[strip:],
                        size=int(item["Size"]),
                        modified_at=item["LastModified"].timestamp(),
                    )
        except (BotoCoreError, ClientError) as error:
            _raise_translated("list", prefix, error)

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self._bucket, Key=self._prefix + key)
        except (BotoCoreError, ClientError) as error:
            _raise_translated("delete", key, error)

    def sweep_abandoned(self, older_than_s: float) -> int:
        cutoff = time.time() - older_than_s
        aborted = 0
        try:
            paginator = self._client.get_paginator("list_multipart_uploads")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=self._prefix):
                for upload in page.get("Uploads", []):
                    if upload["Initiated"].timestamp() < cutoff:
                        self._client.abort_multipart_upload(
                            Bucket=self._bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                        aborted += 1
        except (BotoCoreError, ClientError) as error:
            _raise_translated("sweep uploads under", self._prefix, error)
        return aborted


class _EmptyBody:
    def read(self, size: int | None = None) -> bytes:
        return b""

    def close(self) -> None:
        return None
