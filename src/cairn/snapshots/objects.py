"""The object-store transport under the content-addressed snapshot store.

An `ObjectStore` is as narrow as an httpx transport: write an object atomically, read a byte
range, list by prefix, delete. Everything a snapshot means (packs, trees, headers, retention)
lives above it in `content_store`, so the local directory and the S3 backend implement only
these primitives and share one conformance suite.

The methods are synchronous on purpose: they are only ever called from worker threads that
`cairn._concurrency.run_sync` started, where a blocking read is what we want. Contract:
- an object is visible only after `ObjectWriter.commit()` returned, and then whole
  (temp + rename + fsync locally, a single PUT or completed multipart upload on S3);
- a writer that is aborted, or whose process dies, leaves no visible object;
- `open_reader` of a missing key raises `ObjectMissingError`; other failures raise
  `SnapshotStoreUnavailableError` (never a foreign exception);
- `delete` of a missing key is not an error.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar, Protocol

__all__ = ["ObjectInfo", "ObjectReader", "ObjectStore", "ObjectWriter"]


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    modified_at: float


class ObjectReader(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class ObjectWriter(abc.ABC):
    """Receives one object's bytes; nothing is visible until `commit()`.

    Used as a context manager, a writer that was not committed is aborted on exit, so a
    failure anywhere between open and commit leaves no partial object (invariant 7).
    """

    def __init__(self) -> None:
        self._is_finished = False
        self.size = 0

    def write(self, data: bytes | memoryview) -> None:
        self._write(data)
        self.size += len(data)

    def commit(self) -> None:
        self._commit()
        self._is_finished = True

    def abort(self) -> None:
        if not self._is_finished:
            self._is_finished = True
            self._abort()

    @abc.abstractmethod
    def _write(self, data: bytes | memoryview) -> None: ...

    @abc.abstractmethod
    def _commit(self) -> None: ...

    @abc.abstractmethod
    def _abort(self) -> None: ...

    def __enter__(self) -> ObjectWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.abort()


class ObjectStore(abc.ABC):
    """Stores opaque objects under `/`-separated keys built from validated segments."""

    name: ClassVar[str]

    @abc.abstractmethod
    def open_writer(self, key: str, *, size_hint: int | None = None) -> ObjectWriter:
        """A writer for `key`. `size_hint`, the expected size when known, lets a transport pick
        how to write (the local directory writes large objects around the page cache); the
        object may still end up any size."""

    @abc.abstractmethod
    def open_reader(self, key: str, offset: int = 0, length: int | None = None) -> ObjectReader:
        """A stream of `length` bytes from `offset` (to the end when `length` is None)."""

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every committed object whose key starts with `prefix` (which ends with `/`)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None: ...

    def put_bytes(self, key: str, data: bytes) -> None:
        with self.open_writer(key) as writer:
            writer.write(data)
            writer.commit()

    def get_bytes(self, key: str) -> bytes:
        reader = self.open_reader(key)
        try:
            return reader.read()
        finally:
            reader.close()


    def sweep_abandoned(self, older_than_s: float) -> int:
        """Remove partial writes of writers that died more than `older_than_s` ago; no-op default."""
        return 0
