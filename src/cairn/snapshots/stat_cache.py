"""The stat cache: the content digest of each workspace file, keyed on what `lstat` says.

A file whose (size, mtime, inode, ctime, device) are unchanged since its digest was computed
is not read again, which makes the fingerprint of an unchanged 159 MiB workspace a stat walk
(issue 4: "must not require reading unchanged files again"). `ctime` cannot be set from user
space, so an edit that restores size and mtime still moves it.

The racy case (git calls it "racily clean"): a file modified in the same kernel clock tick as
the moment we looked at it could later change without any stat field moving. Entries whose
ctime is within `RACY_WINDOW_NS` of the start of the scan are therefore never cached; they are
hashed again next time, by which point they are either settled or visibly changed.

Keys are named tuples, compared in C: the skip check builds and compares one per file.
A cache read from the state file is decoded on first use (`decode_later`): a skip check that
the stat listing settles never needs it, only the next persist does.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from pydantic import StrictInt, StrictStr, TypeAdapter, ValidationError

__all__ = ["RACY_WINDOW_NS", "StatCache", "StatKey", "settled", "stat_key"]

logger = logging.getLogger(__name__)

# The coarse kernel clock ticks every 1-10 ms; 50 ms leaves a wide margin.
RACY_WINDOW_NS = 50_000_000


def settled(ctime_ns: int, *, scan_started_ns: int) -> bool:
    """Whether an entry changed at `ctime_ns` can be trusted by a scan that began at `scan_started_ns`."""
    return ctime_ns < scan_started_ns - RACY_WINDOW_NS


class StatKey(NamedTuple):
    size: int
    mtime_ns: int
    ino: int
    ctime_ns: int
    dev: int


def stat_key(st: os.stat_result) -> StatKey:
    return StatKey(st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, st.st_dev)


# One Rust-side validation of the whole cached mapping (strict: a bool is not an int).
_ENCODED = TypeAdapter(dict[str, tuple[StrictInt, StrictInt, StrictInt, StrictInt, StrictInt, StrictStr]])


class StatCache:
    """An immutable path → (StatKey, digest) mapping; a persist or restore builds the next one."""

    def __init__(self, entries: Mapping[str, tuple[StatKey, str]] | None = None) -> None:
        self._entries: dict[str, tuple[StatKey, str]] = dict(entries or {})
        self._encoded: bytes | None = None

    @classmethod
    def decode_later(cls, encoded: bytes) -> StatCache:
        """A cache of the JSON `encoded` (what `to_json` wrote), decoded when first used.

        A malformed encoding then yields an empty cache and a warning: losing the cache costs
        a re-hash, never correctness.
        """
        cache = cls()
        cache._encoded = encoded
        return cache

    def _decoded(self) -> dict[str, tuple[StatKey, str]]:
        encoded = self._encoded
        if encoded is not None:
            try:
                self._entries = StatCache.from_json(json.loads(encoded))._entries
            except ValueError as error:
                logger.warning("ignoring the malformed stat cache of the workspace state: %s", error)
            self._encoded = None
        return self._entries

    def __len__(self) -> int:
        return len(self._decoded())

    def __eq__(self, other: object) -> bool:
        # A cache is equal to itself without decoding: a start settled by the listing compares
        # the cache it loaded with itself, and must keep reading the header alone.
        if self is other:
            return True
        return isinstance(other, StatCache) and self._decoded() == other._decoded()

    __hash__ = None  # type: ignore[assignment]  # mutable-looking contents; never a dict key

    def lookup(self, path: str, key: StatKey) -> str | None:
        # Once per file of every scan: test the attribute instead of calling `_decoded`.
        entries = self._entries if self._encoded is None else self._decoded()
        cached = entries.get(path)
        if cached is None or cached[0] != key:
            return None
        return cached[1]

    @classmethod
    def from_observations(
        cls, observations: Iterable[tuple[str, StatKey, str]], *, scan_started_ns: int
    ) -> StatCache:
        """Cache every observed (path, stat, digest) that is not racy relative to the scan start."""
        return cls(
            {
                path: (key, digest)
                for path, key, digest in observations
                if settled(key.ctime_ns, scan_started_ns=scan_started_ns)
            }
        )

    def to_json(self) -> dict[str, list[object]]:
        return {path: [*key, digest] for path, (key, digest) in self._decoded().items()}

    @classmethod
    def from_json(cls, data: Any) -> StatCache:
        """The inverse of `to_json`; raises ValueError when `data` is not what it wrote."""
        try:
            decoded = _ENCODED.validate_python(data)
        except ValidationError as error:
            raise ValueError(f"the stat cache is malformed: {error.error_count()} bad field(s)") from error
        return cls({path: (StatKey(*fields[:5]), fields[5]) for path, fields in decoded.items()})
