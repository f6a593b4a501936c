"""HTTP/1.1 message framing for the egress proxy: message heads, and the bodies it rewrites.

The proxy parses the messages it changes: a request head (every proxied connection's
first), and on an intercepted connection every request and response, since replacing a
credential changes a body's length. A body is re-framed as it is relayed: a
`Content-Length` body is re-measured (held whole up to `BUFFERED_BODY_MAX`, streamed as
chunked beyond), a chunked one is re-chunked as it streams (its trailers replaced too),
and one delimited by the end of the connection (a response without either, or whatever
follows a protocol switch) is relayed as it comes. Each direction is a `Flow`: where its
messages come from, where they go, its `Substituter`, and the status a malformed message
of that direction is answered with (400 for the client's, 502 for the upstream's).
Nothing unparsed is passed on: a message that does not parse ends the connection. Only
a body too large to hold (a sized one beyond `BUFFERED_BODY_MAX` or the session's
`HeldBytes`, a chunk beyond `_READ`) streams a read at a time, so what its sender announces
never decides what the proxy holds.
"""

from __future__ import annotations

import asyncio
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from cairn.sandbox.egress.substitution import Substituter

__all__ = [
    "BUFFERED_BODY_MAX",
    "HEAD_MAX",
    "HELD_PER_SESSION",
    "Flow",
    "HeldBytes",
    "HttpError",
    "RequestHead",
    "ResponseHead",
    "Send",
    "body_framing",
    "read_head",
    "relay_chunked",
    "relay_sized",
    "relay_unframed",
]

HEAD_MAX = 64 * 1024
BUFFERED_BODY_MAX = 8 * 1024 * 1024
HELD_PER_SESSION = 4 * BUFFERED_BODY_MAX
_READ = 1024 * 1024

_CHUNK_SIZE = re.compile(rb"[0-9a-fA-F]{1,16}")

Send = Callable[[bytes], Awaitable[None]]


class HttpError(Exception):
    """A message the proxy cannot parse; `status` is what the client is answered (or, once
    a connection is under way, why it ended)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HeldBytes:
    """The body bytes a session's connections hold at once to re-measure them, bounded, so
    that sandbox code opening many connections cannot make the worker hold a body at the
    most on each: past the bound, a body streams as chunked instead. The proxy's loop only."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._held = 0

    @contextmanager
    def reserve(self, size: int) -> Iterator[bool]:
        """Whether `size` more bytes may be held, for the time of the `with`."""
        granted = self._held + size <= self._limit
        if granted:
            self._held += size
        try:
            yield granted
        finally:
            if granted:
                self._held -= size


@dataclass(frozen=True, slots=True)
class Flow:
    """One direction of a connection whose messages the proxy parses."""

    reader: asyncio.StreamReader
    send: Send
    substituter: Substituter
    what: str  # "request" or "response", for errors
    malformed: int  # the status of an error in this direction's messages
    held: HeldBytes  # the session's, shared by its connections

    def error(self, problem: str) -> HttpError:
        return HttpError(self.malformed, f"malformed {self.what}: {problem}")


class _Head(ABC):
    """What request and response heads share: their header fields, read and rendered."""

    __slots__ = ()
    headers: list[tuple[str, str]]

    def get(self, name: str) -> str | None:
        lowered = name.lower()
        return next((value for key, value in self.headers if key.lower() == lowered), None)

    def get_all(self, name: str) -> list[str]:
        lowered = name.lower()
        return [value for key, value in self.headers if key.lower() == lowered]

    def edited(self, *, drop: tuple[str, ...] = (), add: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
        """The header fields without those named in `drop`, with `add` at the end."""
        dropped = {name.lower() for name in drop}
        return [(name, value) for name, value in self.headers if name.lower() not in dropped] + list(add)

    def render(self, *, drop: tuple[str, ...] = (), add: tuple[tuple[str, str], ...] = ()) -> bytes:
        lines = [self.start_line(), *(f"{name}: {value}" for name, value in self.edited(drop=drop, add=add))]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    @abstractmethod
    def start_line(self) -> str: ...


def _split_head(raw: bytes, status: int, what: str) -> tuple[str, list[tuple[str, str]]]:
    """A head's start line and its header fields."""
    lines = raw.decode("latin-1").rstrip("\r\n").split("\r\n")  # latin-1 decodes every byte
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(status, f"malformed {what}: a malformed header line")
        headers.append((name, value.strip()))
    return lines[0], headers


@dataclass(frozen=True, slots=True)
class RequestHead(_Head):
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    @classmethod
    def parse(cls, raw: bytes) -> RequestHead:
        start, headers = _split_head(raw, 400, "request")
        parts = start.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise HttpError(400, "malformed request: a malformed request line")
        return cls(parts[0].upper(), parts[1], parts[2], headers)

    def start_line(self) -> str:
        return f"{self.method} {self.target} {self.version}"


@dataclass(frozen=True, slots=True)
class ResponseHead(_Head):
    status: int
    reason: str
    headers: list[tuple[str, str]]

    @classmethod
    def parse(cls, raw: bytes) -> ResponseHead:
        start, headers = _split_head(raw, 502, "response")
        version, _, rest = start.partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit() or code[0] == "0":
            raise HttpError(502, "malformed response: a malformed status line")
        return cls(int(code), reason, headers)

    def start_line(self) -> str:
        # An intermediary sends its own HTTP version (RFC 9110, 6.2): the framing it adds
        # (chunked) is HTTP/1.1's, whatever the upstream spoke.
        return f"HTTP/1.1 {self.status} {self.reason}".rstrip()


async def read_head(flow: Flow) -> bytes | None:
    """The next head (through its blank line), or None at a clean end of stream."""
    try:
        raw = await flow.reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise flow.error("the connection ended inside a head") from exc
        return None
    except asyncio.LimitOverrunError as exc:
        raise HttpError(431 if flow.malformed == 400 else flow.malformed, f"{flow.what} head too large") from exc
    if len(raw) > HEAD_MAX:  # a reader's limit may be larger than a head's (the upstream's is)
        raise HttpError(431 if flow.malformed == 400 else flow.malformed, f"{flow.what} head too large")
    return raw


def body_framing(flow: Flow, head: _Head) -> int | Literal["chunked"] | None:
    """How a message's body is framed: its length, chunked (which must be the only transfer
    coding, without a Content-Length: anything else could be read two ways), or neither."""
    lengths, codings = set(head.get_all("content-length")), head.get_all("transfer-encoding")
    if codings:
        if [coding.strip().lower() for coding in codings] != ["chunked"] or lengths:
            raise flow.error("a body must be chunked or have one Content-Length, not both nor another coding")
        return "chunked"
    if not lengths:
        return None
    if len(lengths) != 1 or not (length := lengths.pop()).isdigit():
        raise flow.error("bad Content-Length")
    return int(length)


async def relay_sized(flow: Flow, head: _Head, length: int, *, hold: bool) -> None:
    """Relay a `Content-Length` body: held and re-measured if `hold`, it is small enough
    and the session's `HeldBytes` allow, otherwise streamed as chunked (its new length is
    unknown until its end)."""
    if hold and length <= BUFFERED_BODY_MAX:
        with flow.held.reserve(length) as granted:
            if granted:
                body = flow.substituter.replace_all(await _read_exactly(flow, length)) if length else b""
                await flow.send(head.render(drop=("content-length",), add=(("Content-Length", str(len(body))),)) + body)
                return
    await flow.send(head.render(drop=("content-length",), add=(("Transfer-Encoding", "chunked"),)))
    await _relay_piecewise(flow, length)
    await _send_chunk(flow, flow.substituter.flush())
    await flow.send(b"0\r\n\r\n")


async def relay_chunked(flow: Flow) -> None:
    """Relay a chunked body, re-chunked as it streams, then its trailers."""
    while True:
        token = (await _line(flow)).split(b";", 1)[0].strip()
        if not _CHUNK_SIZE.fullmatch(token):
            raise flow.error("bad chunk size")
        if (size := int(token, 16)) == 0:
            break
        if size <= _READ:  # held whole, so a chunk with a bad ending passes nothing on
            data = await _read_exactly(flow, size + 2)
            if data[-2:] != b"\r\n":
                raise flow.error("bad chunk ending")
            await _send_chunk(flow, flow.substituter.feed(data[:-2]))
            continue
        await _relay_piecewise(flow, size)
        if await _read_exactly(flow, 2) != b"\r\n":
            raise flow.error("bad chunk ending")
    await _send_chunk(flow, flow.substituter.flush())
    trailers = b"0\r\n"
    while (line := await _line(flow)) != b"\r\n":
        trailers += flow.substituter.replace_all(line)
        if len(trailers) > HEAD_MAX:
            raise flow.error("trailers too large")
    await flow.send(trailers + b"\r\n")


async def relay_unframed(flow: Flow) -> None:
    """Relay the rest of the stream, substituted, until it ends (after a protocol switch,
    or a response delimited by the end of the connection)."""
    while chunk := await flow.reader.read(_READ):
        if data := flow.substituter.feed(chunk):
            await flow.send(data)
    if rest := flow.substituter.flush():
        await flow.send(rest)


async def _relay_piecewise(flow: Flow, size: int) -> None:
    """Relay the next `size` bytes as chunks, a read at a time: a large body or chunk is
    never held whole, whatever size its sender announced."""
    while size:
        piece = await flow.reader.read(min(_READ, size))
        if not piece:
            raise flow.error("the connection ended inside a body")
        size -= len(piece)
        await _send_chunk(flow, flow.substituter.feed(piece))


async def _read_exactly(flow: Flow, size: int) -> bytes:
    try:
        return await flow.reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise flow.error("the connection ended inside a body") from exc


async def _line(flow: Flow) -> bytes:
    try:
        return await flow.reader.readuntil(b"\r\n")
    except asyncio.IncompleteReadError as exc:
        raise flow.error("the connection ended inside a chunked body") from exc
    except asyncio.LimitOverrunError as exc:
        raise flow.error("chunk line too long") from exc


async def _send_chunk(flow: Flow, data: bytes) -> None:
    if data:
        # One copy: `%`-formatting the data in would grow its result piece by piece (30x slower).
        await flow.send(b"".join((b"%x\r\n" % len(data), data, b"\r\n")))
