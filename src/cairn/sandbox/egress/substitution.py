"""Placeholder-for-secret replacement over a byte stream that arrives in pieces.

A `Substituter` knows a session's placeholders: those of credentials allowed for the
destination are replaced by their secret, the others pass unchanged and are counted
(`withheld`: the proxy reports them). It holds back only as many bytes as a placeholder
split across two pieces could need (the longest placeholder less one), so a stream of any
size flows through in bounded memory.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from cairn.sandbox.egress.credentials import WireSecret

__all__ = ["Substituter"]


class Substituter:
    def __init__(self, allowed: Iterable[WireSecret], others: Iterable[WireSecret]) -> None:
        self._replacement: dict[bytes, bytes] = {}
        for secret in others:
            self._replacement[secret.placeholder.encode()] = secret.placeholder.encode()
        for secret in allowed:
            self._replacement[secret.placeholder.encode()] = secret.value.encode()
        placeholders = sorted((p for p in self._replacement if p), key=len, reverse=True)
        self._pattern = re.compile(b"|".join(re.escape(p) for p in placeholders)) if placeholders else None
        self._hold = max((len(p) for p in placeholders), default=1) - 1
        self._pending = b""
        self.substituted = 0
        self.withheld = 0

    @property
    def is_active(self) -> bool:
        """Whether there is any placeholder to look for."""
        return self._pattern is not None

    def feed(self, chunk: bytes) -> bytes:
        """What can be sent of the stream so far."""
        return self._process(self._pending + chunk, final=False)

    def flush(self) -> bytes:
        """The rest, at the end of the stream (or of a message)."""
        return self._process(self._pending, final=True)

    def replace_all(self, data: bytes) -> bytes:
        """`data` as one complete piece (a request head, a whole body)."""
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
            placeholder = match.group()
            replacement = self._replacement[placeholder]
            if replacement == placeholder:
                self.withheld += 1
            else:
                self.substituted += 1
            out += (data[position : match.start()], replacement)
            position = match.end()
        cut = max(position, safe)
        out.append(data[position:cut])
        self._pending = data[cut:]
        return b"".join(out)
