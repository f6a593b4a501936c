"""Replacing a session's credentials over a byte stream that arrives in pieces, both ways.

One `Substituter` replaces the keys of a mapping by their values as a stream flows through
it. The proxy makes two kinds (invariant: sandbox code never holds a real secret):
- `Substituter.for_requests`: placeholders of credentials allowed for the destination are
  replaced by their secret; the session's other placeholders pass unchanged and are counted
  (`unchanged`: the proxy reports them as withheld);
- `Substituter.for_responses`: every secret of the session is replaced by its credential's
  placeholder before a response reaches the sandbox (`replaced`: the proxy reports the
  redactions).
It holds back only the end of a piece that could be the beginning of a key split across
two pieces (at most the longest key less one byte), so a stream of any size flows through
in bounded memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from cairn.sandbox.egress.credentials import WireSecret

__all__ = ["Substituter"]


class Substituter:
    def __init__(self, replacements: Mapping[bytes, bytes]) -> None:
        self._replacement = {key: value for key, value in replacements.items() if key}
        # Longest first: of keys found at the same place, the longest is replaced.
        self._keys = sorted(self._replacement, key=len, reverse=True)
        self._firsts = frozenset(key[0] for key in self._keys)
        self._hold = max((len(key) for key in self._keys), default=1) - 1
        self._pending = b""
        self.replaced = 0
        self.unchanged = 0

    @classmethod
    def for_requests(cls, allowed: Iterable[WireSecret], others: Iterable[WireSecret]) -> Substituter:
        """Placeholders of `allowed` become their secrets; those of `others` are only counted."""
        replacements = {secret.placeholder.encode(): secret.placeholder.encode() for secret in others}
        replacements.update((secret.placeholder.encode(), secret.value.encode()) for secret in allowed)
        return cls(replacements)

    @classmethod
    def for_responses(cls, secrets: Iterable[WireSecret]) -> Substituter:
        """Every secret becomes its credential's placeholder."""
        return cls({secret.value.encode(): secret.placeholder.encode() for secret in secrets})

    @property
    def is_active(self) -> bool:
        """Whether there is anything to look for."""
        return bool(self._keys)

    def feed(self, chunk: bytes) -> bytes:
        """What can be sent of the stream so far."""
        return self._process(self._pending + chunk if self._pending else chunk, final=False)

    def flush(self) -> bytes:
        """The rest, at the end of the stream (or of a message)."""
        return self._process(self._pending, final=True)

    def replace_all(self, data: bytes) -> bytes:
        """`data` as one complete piece (a message head, a whole body), between streams."""
        return self._process(data, final=True)

    def _process(self, data: bytes, *, final: bool) -> bytes:
        # Only a tail that could still become a key is held back (usually none: a piece
        # with nothing to replace then goes on as it came, uncopied); a key found before
        # that tail cannot grow into a longer one with what comes next.
        safe = len(data) if final else len(data) - self._held(data)
        out: list[bytes] = []
        position = 0
        for start, key in self._occurrences(data, safe):
            replacement = self._replacement[key]
            if replacement == key:
                self.unchanged += 1
            else:
                self.replaced += 1
            out += (data[position:start], replacement)
            position = start + len(key)
        cut = max(position, safe)
        self._pending = data[cut:]
        if position == 0 and cut == len(data):
            return data
        out.append(data[position:cut])
        return b"".join(out)

    def _occurrences(self, data: bytes, before: int) -> Iterator[tuple[int, bytes]]:
        """The keys in `data` that start before `before`, leftmost first, without overlaps
        (`bytes.find` per key: far faster than a regular expression's alternation)."""
        found = {key: data.find(key, 0, before + len(key) - 1) for key in self._keys}
        position = 0
        while True:
            start, key = min(((at, key) for key, at in found.items() if at >= 0), default=(-1, b""),
                             key=lambda pair: pair[0])
            if start < 0:
                return
            yield start, key
            position = start + len(key)
            for other, at in found.items():
                if 0 <= at < position:
                    found[other] = data.find(other, position, before + len(other) - 1)

    def _held(self, data: bytes) -> int:
        """The length of the longest tail of `data` that is the beginning of a key."""
        for size in range(min(self._hold, len(data)), 0, -1):
            tail = data[-size:]
            if tail[0] in self._firsts and any(len(key) > size and key.startswith(tail) for key in self._keys):
                return size
        return 0
