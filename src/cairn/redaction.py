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
import logging
import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, quote_plus

__all__ = ["MIN_SECRET_CHARS", "REDACTED", "KnownValues", "Redactor", "SessionRedactors", "StreamRedactor", "redacted_log_records"]

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


class KnownValues:
    """The secret values one session's execution knows, and their redactor.

    Made from the session's credentials when a turn starts in a worker; a value the operator's
    code registers while the turn runs (`ToolContext.register_secret`) is added for the rest of
    that execution. In memory only: `repr` names no value and it refuses to be pickled."""

    __slots__ = ("_generation", "_redactor", "_values")

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._values: frozenset[str] = frozenset()
        self._redactor = Redactor()
        self._generation = 0
        self.add(*values)

    def __repr__(self) -> str:
        return f"<KnownValues: {len(self._values)} secret values>"

    def __reduce__(self) -> Any:
        raise TypeError("known secret values are never serialized")

    def __contains__(self, value: object) -> bool:
        return value in self._values

    def __len__(self) -> int:
        return len(self._values)

    def add(self, *values: str) -> None:
        """Redact `values` too from now on (each at least `MIN_SECRET_CHARS` long)."""
        added = frozenset(values) - self._values
        if not added:
            return
        redactor = Redactor(self._values | added)  # raises for a value too short, before anything changes
        self._values |= added
        self._redactor = redactor
        self._generation += 1

    @property
    def values(self) -> frozenset[str]:
        return self._values

    @property
    def generation(self) -> int:
        """Changes whenever a value is added (for caches built over several sessions)."""
        return self._generation

    @property
    def redactor(self) -> Redactor:
        return self._redactor


class SessionRedactors:
    """The known values of every session whose turn this process runs right now.

    The journal asks it for a session's redactor before it writes that session's items and
    events; the log record factory (`redacted_log_records`) applies all of them to every log
    line of the process, whichever task or thread writes it. One per runtime."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, list[KnownValues]] = {}
        self._union: tuple[tuple[tuple[int, int], ...], Redactor] = ((), Redactor())

    @contextmanager
    def holding(self, session_id: str, known: KnownValues) -> Iterator[KnownValues]:
        """`known` is the session's while the block runs (an execution of one of its turns)."""
        with self._lock:
            self._held.setdefault(session_id, []).append(known)
        try:
            yield known
        finally:
            with self._lock:
                held = self._held[session_id]
                held.remove(known)
                if not held:
                    del self._held[session_id]

    def for_session(self, session_id: str) -> Redactor:
        """The redactor of `session_id`'s known values (empty when none are held here)."""
        with self._lock:
            held = list(self._held.get(session_id, ()))
        if not held:
            return _EMPTY
        if len(held) == 1:
            return held[0].redactor
        return Redactor(set().union(*(k.values for k in held)))

    def everywhere(self) -> Redactor:
        """One redactor of every value held in this process (for log lines)."""
        with self._lock:
            known = [k for held in self._held.values() for k in held]
            stamp = tuple((id(k), k.generation) for k in known)
            if stamp != self._union[0]:
                self._union = (stamp, Redactor(set().union(*(k.values for k in known))) if known else _EMPTY)
            return self._union[1]


_EMPTY = Redactor()


@contextmanager
def redacted_log_records(redactors: SessionRedactors) -> Iterator[None]:
    """While the block runs, every log record this process makes has the known values of
    `redactors` replaced in its message and its traceback, whatever logger or handler it goes
    to (the one choke point of log lines: the record factory)."""
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        redactor = redactors.everywhere()
        if redactor.is_empty:
            return record
        message = record.getMessage()
        record.msg, record.args = redactor.text(message), None
        if record.exc_info:
            record.exc_text = redactor.text(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = redactor.text(record.stack_info)
        return record

    logging.setLogRecordFactory(factory)
    try:
        yield
    finally:
        logging.setLogRecordFactory(previous)
