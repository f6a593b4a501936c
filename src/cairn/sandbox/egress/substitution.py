"""Replacing a session's credentials over a byte stream that arrives in pieces, both ways.

One `Substituter` replaces the keys of a mapping by their values as a stream flows through
it. The proxy makes two kinds (invariant: sandbox code never holds a real secret):
- `Substituter.for_requests`: placeholders of credentials allowed for the destination are
  replaced by their secret; the session's other placeholders pass unchanged and are counted
  (`unchanged`: the proxy reports them as withheld);
- `Substituter.for_responses`: every secret of the session is replaced by its credential's
  placeholder before a response reaches the sandbox (`replaced`: the proxy reports the
  redactions).
It holds back only as many bytes as a key split across two pieces could need (the longest
key less one), so a stream of any size flows through in bounded memory.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from cairn.sandbox.egress.credentials import WireSecret

__all__ = ["Substituter"]


class Substituter:
    def __init__(self, replacements: Mapping[bytes, bytes]) -> None:
        self._replacement = {key: value for key, value in replacements.items() if key}
        keys = sorted(self._replacement, key=len, reverse=True)  # the longest of overlapping keys wins
        self._pattern = re.compile(b"|".join(re.escape(key) for key in keys)) if keys else None
        self._hold = max((len(key) for key in keys), default=1) - 1
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
        return self._pattern is not None

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
        if self._pattern is None:
            self._pending = b""
            return data
        safe = len(data) if final else max(0, len(data) - self._hold)
        out: list[bytes] = []
        position = 0
        for match in self._pattern.finditer(data):
            if match.start() >= safe:
                break
            key = match.group()
            replacement = self._replacement[key]
            if replacement == key:
                self.unchanged += 1
            else:
                self.replaced += 1
            out += (data[position : match.start()], replacement)
            position = match.end()
        cut = max(position, safe)
        if position == 0 and cut == len(data):
            self._pending = b""
            return data  # nothing found, nothing held: no copy
        out.append(data[position:cut])
        self._pending = data[cut:]
        return b"".join(out)
