"""Known secret values replaced by a marker before anything is stored (design invariant 6).

A `Redactor` is given the values to hide (the credentials of a session's vaults, the values an
operator registered) and replaces each of them, in any text or JSON value (object keys
included), in the forms a command's output most plainly turns it into:

- the value itself;
- its Base64, standard or URL-safe, padded or not: the whole encoding of the value alone
  (`echo -n "$TOKEN" | base64`), and, at each of the three byte alignments, the characters
  that encode only the value's bytes, so it is found inside a longer Base64 text too (a token
  in an encoded JSON document); the one or two characters at either end that mix the value
  with its neighbours stay;
- its percent-encoding (upper- or lower-case hex digits, `+` or `%20` for a space);
- its hex digits (lower or upper case);
- its escaped form inside a JSON string.

`StreamRedactor` does the same over a stream of chunks (a command's output deltas), where a
value may arrive split between two chunks: it holds back the tail that could still begin
one, and releases it with the next chunk or at the end.

This is a net for accidents (`echo $TOKEN`, a tool that returns its own credential), not a
wall against hostile code: a value reversed, encrypted or printed a character per line goes
through. That is why sandboxed code never receives the real value of a credential in the
first place (docs/security.md).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus

__all__ = ["MIN_SECRET_CHARS", "REDACTED", "Redactor", "StreamRedactor"]

REDACTED = "[redacted]"
# A shorter value could not be told apart from ordinary text: redacting it would blank out
# unrelated words, and missing it is not an option.
MIN_SECRET_CHARS = 8
# A form shorter than this (an alignment of a short value) would match ordinary Base64 text.
_MIN_FORM_CHARS = 8


def _base64_forms(raw: bytes) -> set[str]:
    forms = set()
    whole = base64.b64encode(raw).decode()
    forms.update({whole, whole.rstrip("=")})
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode().rstrip("=")
        first = -(-8 * offset // 6)  # the first character made of the value's bits only
        last = (8 * (offset + len(raw))) // 6  # one past the last such character
        forms.add(encoded[first:last])
    return forms | {f.translate(str.maketrans("+/", "-_")) for f in forms}


def _forms(value: str) -> set[str]:
    """Every form of `value` the redactor looks for."""
    raw = value.encode()
    forms = {value, raw.hex(), raw.hex().upper(), json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    for encoded in (quote(value, safe=""), quote_plus(value, safe="")):
        forms.update({encoded, re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), encoded)})
    forms |= _base64_forms(raw)
    return {f for f in forms if len(f) >= _MIN_FORM_CHARS}


class Redactor:
    """Replaces known secret values, and their plain encodings, by `REDACTED`."""

    __slots__ = ("_longest", "_pattern")

    def __init__(self, values: Iterable[str] = ()) -> None:
        forms: set[str] = set()
        for value in values:
            if len(value) < MIN_SECRET_CHARS:
                raise ValueError(f"a secret value to redact must be at least {MIN_SECRET_CHARS} characters")
            forms |= _forms(value)
        # Longest first: where two forms start at the same place, the longer one is replaced.
        ordered = sorted(forms, key=lambda f: (-len(f), f))
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._longest = len(ordered[0]) if ordered else 0

    def __repr__(self) -> str:
        # Never the values: reprs end up in logs.
        return f"<Redactor: {'no' if self._pattern is None else 'some'} secret values>"

    @property
    def is_empty(self) -> bool:
        return self._pattern is None

    @property
    def longest_form(self) -> int:
        """The length of the longest form looked for: a stream holds back one less than this."""
        return self._longest

    def text(self, text: str) -> str:
        """`text` with every known value replaced."""
        return text if self._pattern is None else self._pattern.sub(REDACTED, text)

    def value(self, value: Any) -> Any:
        """A JSON value with every string (and object key) redacted; other values as they are."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(str(k)) if isinstance(k, str) else k: self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value

    def finds(self, value: Any) -> bool:
        """Whether a known value appears anywhere in `value` (text or JSON)."""
        if self._pattern is None:
            return False
        if isinstance(value, str):
            return self._pattern.search(value) is not None
        if isinstance(value, dict):
            return any(self.finds(k) or self.finds(v) for k, v in value.items())
        if isinstance(value, list | tuple):
            return any(self.finds(v) for v in value)
        return False

    def stream(self) -> StreamRedactor:
        return StreamRedactor(self)

    def search(self, text: str, start: int) -> re.Match[str] | None:
        return None if self._pattern is None else self._pattern.search(text, start)


class StreamRedactor:
    """Redacts a stream of text chunks; what it returns is safe to store or send as it comes.

    A chunk's last `longest_form - 1` characters are held back (a value may begin there and
    end in the next chunk), unless a whole value found there ends later; `flush` releases the
    rest at the end of the stream."""

    __slots__ = ("_held", "_redactor")

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._held = ""

    def feed(self, chunk: str) -> str:
        redactor = self._redactor
        if redactor.is_empty:
            return chunk
        text = self._held + chunk
        # A match starting before `safe` had all the characters the longest form needs.
        safe = max(0, len(text) - (redactor.longest_form - 1))
        out: list[str] = []
        position = 0
        while (found := redactor.search(text, position)) is not None and found.start() < safe:
            out += [text[position : found.start()], REDACTED]
            position = found.end()
        end = max(position, safe)
        out.append(text[position:end])
        self._held = text[end:]
        return "".join(out)

    def flush(self) -> str:
        """What is held back, redacted: the end of the stream."""
        rest, self._held = self._held, ""
        return self._redactor.text(rest)
