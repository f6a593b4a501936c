"""The little of HTTP/1.1 the egress proxy parses: a request head, and the framing of the
request bodies it rewrites when it substitutes credentials.

Only requests are parsed. Responses are relayed as they come, so nothing but the request
stream needs framing: a substituted placeholder changes a body's length, so a
`Content-Length` body is re-measured (held whole up to `BUFFERED_BODY_MAX`, streamed as
chunked beyond), and a chunked body is re-chunked as it streams. After a request that
upgrades the connection (WebSocket) the rest of the stream is relayed with substitution
but without framing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cairn.sandbox.egress.substitution import Substituter

__all__ = ["HEAD_MAX", "HttpError", "RequestHead", "read_head", "relay_requests"]

HEAD_MAX = 64 * 1024
BUFFERED_BODY_MAX = 8 * 1024 * 1024
_READ = 256 * 1024

Send = Callable[[bytes], Awaitable[None]]


class HttpError(Exception):
    """A request the proxy cannot parse; `status` is what the client is answered."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    @classmethod
    def parse(cls, head: bytes) -> RequestHead:
        try:
            text = head.decode("latin-1")
        except UnicodeDecodeError as exc:  # latin-1 decodes every byte; kept for mypy's sake
            raise HttpError(400, "undecodable request head") from exc
        lines = text.rstrip("\r\n").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise HttpError(400, "malformed request line")
        headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise HttpError(400, "malformed header line")
            headers.append((name, value.strip()))
        return cls(parts[0].upper(), parts[1], parts[2], headers)

    def get(self, name: str) -> str | None:
        lowered = name.lower()
        return next((value for key, value in self.headers if key.lower() == lowered), None)

    def render(self, *, target: str | None = None, drop: tuple[str, ...] = (), add: tuple[tuple[str, str], ...] = ()) -> bytes:
        dropped = {name.lower() for name in drop}
        lines = [f"{self.method} {target or self.target} {self.version}"]
        lines += [f"{name}: {value}" for name, value in self.headers if name.lower() not in dropped]
        lines += [f"{name}: {value}" for name, value in add]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The next request head (through its blank line), or None at a clean end of stream."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise HttpError(400, "the connection ended inside a request head") from exc
        return None
    except asyncio.LimitOverrunError as exc:
        raise HttpError(431, "request head too large") from exc


async def relay_requests(reader: asyncio.StreamReader, send: Send, substituter: Substituter) -> None:
    """Relay the client's requests to `send`, placeholders substituted, until its stream ends."""
    while (raw := await read_head(reader)) is not None:
        head = RequestHead.parse(substituter.replace_all(raw))
        length, coding = head.get("content-length"), head.get("transfer-encoding")
        if coding is not None:
            if coding.lower() != "chunked" or length is not None:
                raise HttpError(400, "a request body must be chunked or have one Content-Length, not both")
            await send(head.render())
            await _relay_chunked(reader, send, substituter)
        elif length is not None:
            if not length.isdigit():
                raise HttpError(400, "bad Content-Length")
            await _relay_sized(reader, send, substituter, head, int(length))
        else:
            await send(head.render())
        if head.method == "CONNECT" or head.get("upgrade") is not None:
            # An upgraded connection (101) carries another protocol from here on.
            while chunk := await reader.read(_READ):
                await send(substituter.feed(chunk))
            await send(substituter.flush())
            return


async def _relay_sized(
    reader: asyncio.StreamReader, send: Send, substituter: Substituter, head: RequestHead, length: int
) -> None:
    # A client that waits for `100 Continue` sends its body only once the head went out: its
    # body streams (chunked) like a large one instead of being held for re-measuring.
    waits_for_continue = (head.get("expect") or "").lower() == "100-continue"
    if length <= BUFFERED_BODY_MAX and not waits_for_continue:
        body = substituter.replace_all(await reader.readexactly(length)) if length else b""
        await send(head.render(drop=("content-length",), add=(("Content-Length", str(len(body))),)) + body)
        return
    await send(head.render(drop=("content-length",), add=(("Transfer-Encoding", "chunked"),)))
    remaining = length
    while remaining:
        chunk = await reader.read(min(_READ, remaining))
        if not chunk:
            raise HttpError(400, "the connection ended inside a request body")
        remaining -= len(chunk)
        await _send_chunk(send, substituter.feed(chunk))
    await _send_chunk(send, substituter.flush())
    await send(b"0\r\n\r\n")


async def _relay_chunked(reader: asyncio.StreamReader, send: Send, substituter: Substituter) -> None:
    while True:
        line = await _line(reader)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise HttpError(400, "bad chunk size") from exc
        if size == 0:
            break
        data = await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise HttpError(400, "bad chunk ending")
        await _send_chunk(send, substituter.feed(data))
    await _send_chunk(send, substituter.flush())
    trailers = b"0\r\n"
    while (line := await _line(reader)) != b"\r\n":
        trailers += substituter.replace_all(line)
    await send(trailers + b"\r\n")


async def _line(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readuntil(b"\r\n")
    except asyncio.LimitOverrunError as exc:
        raise HttpError(400, "chunk line too long") from exc


async def _send_chunk(send: Send, data: bytes) -> None:
    if data:
        await send(b"%x\r\n%s\r\n" % (len(data), data))
