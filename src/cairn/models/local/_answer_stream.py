"""Streams the final answer's text out of a reply while the model is still writing it.

The constrained reply is JSON (`_reply`), so the answer arrives as a JSON string
inside `{"thought": "…", "name": "final_answer", "arguments": {"text": "…"}}`. Waiting for the closing
brace would turn a minute of token-by-token output into one late block; instead this
watches the raw text, recognizes the final-answer prefix as soon as it is complete, and
decodes the string value incrementally. An escape split across tokens (`\\` then `n`, or
half of `\\u00e9`, or one half of a surrogate pair) is held back until it is complete, so
every piece emitted is final text and the pieces concatenate to the decoded value.

The thought is skipped: it is the model's note to itself, not part of the answer. Any
other reply shape (a tool call, or keys in an unexpected order) emits nothing here; the
caller then takes the text from the parsed reply at the end.
"""

from __future__ import annotations

import re

__all__ = ["AnswerStream"]

# An optional leading thought (skipped, not streamed), then the name, then the text.
_THOUGHT = r'(?:"thought"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*)?'
_PREFIX = re.compile(
    r'\s*\{\s*' + _THOUGHT + r'"name"\s*:\s*"final_answer"\s*,\s*"arguments"\s*:\s*\{\s*"text"\s*:\s*"'
)
_NAMED = re.compile(r'\s*\{\s*' + _THOUGHT + r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_FIRST_KEY = re.compile(r'\s*\{\s*"((?:[^"\\]|\\.)*)"')

_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class AnswerStream:
    """Feed raw reply text in; get decoded final-answer text out, as it becomes certain."""

    def __init__(self) -> None:
        self._raw = ""
        self._pos = -1  # index in _raw of the next undecoded answer character; -1 = not found
        self._is_dead = False  # this reply is not a streamable final answer
        self._is_done = False  # the closing quote was seen
        self._pending_high_surrogate: str | None = None

    @property
    def is_answer(self) -> bool:
        """Whether the reply was recognized as a final answer (and so has been streaming)."""
        return self._pos >= 0

    def feed(self, piece: str) -> str:
        """Add generated text; return newly decoded answer text (possibly empty)."""
        self._raw += piece
        if self._is_dead or self._is_done:
            return ""
        if self._pos < 0:
            match = _PREFIX.match(self._raw)
            if match is None:
                self._is_dead = _cannot_become_answer(self._raw)
                return ""
            self._pos = match.end()
        return self._decode_available()

    def _decode_available(self) -> str:
        out: list[str] = []
        raw = self._raw
        i = self._pos
        while i < len(raw):
            ch = raw[i]
            if ch == '"':
                self._is_done = True
                i += 1
                break
            if ch != "\\":
                out.append(self._join_surrogate(ch))
                i += 1
                continue
            if i + 1 >= len(raw):
                break  # the escape's second character has not arrived yet
            kind = raw[i + 1]
            if kind == "u":
                hex_digits = raw[i + 2 : i + 6]
                if len(hex_digits) < 4:
                    break
                if not re.fullmatch(r"[0-9a-fA-F]{4}", hex_digits):
                    # Not valid JSON; the grammar rules it out, so stop rather than guess.
                    self._is_dead = True
                    break
                out.append(self._join_surrogate(chr(int(hex_digits, 16))))
                i += 6
                continue
            decoded = _SIMPLE_ESCAPES.get(kind)
            if decoded is None:
                self._is_dead = True
                break
            out.append(self._join_surrogate(decoded))
            i += 2
        self._pos = i
        return "".join(out)

    def _join_surrogate(self, ch: str) -> str:
        """Hold a high surrogate until its low half arrives, so no lone half is emitted."""
        code = ord(ch)
        if 0xD800 <= code <= 0xDBFF:
            self._pending_high_surrogate = ch
            return ""
        high, self._pending_high_surrogate = self._pending_high_surrogate, None
        if high is not None and 0xDC00 <= code <= 0xDFFF:
            return chr(0x10000 + ((ord(high) - 0xD800) << 10) + (code - 0xDC00))
        return ("\ufffd" if high is not None else "") + ch


def _cannot_become_answer(raw: str) -> bool:
    """Whether the reply so far already rules out a streamable final answer."""
    named = _NAMED.match(raw)
    if named is not None:
        return named.group(1) != "final_answer"
    stripped = raw.lstrip()
    if stripped and not stripped.startswith("{"):
        return True
    first_key = _FIRST_KEY.match(raw)
    return first_key is not None and first_key.group(1) not in ("thought", "name")
