"""The stat cache: the content digest of each workspace file, keyed on what `lstat` says.

A file whose (size, mtime, inode, ctime, device) are unchanged since its digest was computed
is not read again, which makes the fingerprint of an unchanged 159 MiB workspace a stat walk
(issue 4: "must not require reading unchanged files again"). `ctime` cannot be set from user
space, so an edit that restores size and mtime still moves it.

The racy case (git calls it "racily clean"): a file modified in the same kernel clock tick as
the moment we looked at it could later change without any stat field moving. Entries whose
ctime is within `RACY_WINDOW_NS` of the start of the scan are therefore never cached; they are
hashed again next time, by which point they are either settled or visibly changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["RACY_WINDOW_NS", "StatCache", "StatKey"]

# The coarse kernel clock ticks every 1-10 ms; 50 ms leaves a wide margin.
RACY_WINDOW_NS = 50_000_000


@dataclass(frozen=True, slots=True)
class StatKey:
    size: int
    mtime_ns: int
    ino: int
    ctime_ns: int
    dev: int


class StatCache:
    """An immutable path → (StatKey, digest) mapping; a persist or restore builds the next one."""

    def __init__(self, entries: Mapping[str, tuple[StatKey, str]] | None = None) -> None:
        self._entries: dict[str, tuple[StatKey, str]] = dict(entries or {})

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StatCache) and self._entries == other._entries

    __hash__ = None  # type: ignore[assignment]  # mutable-looking contents; never a dict key

    def lookup(self, path: str, key: StatKey) -> str | None:
        cached = self._entries.get(path)
        if cached is None or cached[0] != key:
            return None
        return cached[1]

    @classmethod
    def from_observations(
        cls, observations: Iterable[tuple[str, StatKey, str]], *, scan_started_ns: int
    ) -> StatCache:
        """Cache every observed (path, stat, digest) that is not racy relative to the scan start."""
        horizon = scan_started_ns - RACY_WINDOW_NS
        return cls({path: (key, digest) for path, key, digest in observations if key.ctime_ns < horizon})

    def to_json(self) -> dict[str, list[object]]:
        return {
            path: [key.size, key.mtime_ns, key.ino, key.ctime_ns, key.dev, digest]
            for path, (key, digest) in self._entries.items()
        }

    @classmethod
    def from_json(cls, data: Mapping[str, list[object]]) -> StatCache:
        entries: dict[str, tuple[StatKey, str]] = {}
        for path, fields in data.items():
            numbers = [value for value in fields[:5] if isinstance(value, int)]
            digest = fields[5] if len(fields) == 6 else None
            if len(numbers) != 5 or not isinstance(digest, str):
                raise ValueError(f"stat cache entry for {path!r} is malformed")
            entries[path] = (StatKey(*numbers), digest)
        return cls(entries)
