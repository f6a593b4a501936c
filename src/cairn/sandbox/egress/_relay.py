"""Moving a proxied connection's bytes: in the kernel where the proxy need not read them,
through asyncio streams where it must.

A tunnel (CONNECT to a host without credentials) is relayed with `splice(2)` between the
two raw sockets through a pipe: the bytes never enter Python, so a download keeps most of
a direct connection's throughput. Interception and plain-HTTP forwarding read what they
relay (substitution, the placeholder scan) and use asyncio streams instead.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable

from cairn.sandbox.egress._http import HEAD_MAX, HttpError
from cairn.sandbox.egress.addresses import IPAddress

__all__ = ["Count", "accepted_streams", "connect", "connect_socket", "pump", "receive_head", "run_both", "splice"]

# Counts a direction's bytes and applies the session's bandwidth limit (may wait).
Count = Callable[[int], Awaitable[None]]

_PIPE_SIZE = 1024 * 1024
_READ = 1024 * 1024
_SPLICE_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
_CONNECT_TIMEOUT_S = 10.0
_TLS_HANDSHAKE_TIMEOUT_S = 10.0


async def receive_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The request head on `sock` (through its blank line) and whatever followed it;
    (b"", b"") if the client closed before sending anything."""
    loop = asyncio.get_running_loop()
    data = b""
    while (end := data.find(b"\r\n\r\n")) < 0:
        if len(data) > HEAD_MAX:
            raise HttpError(431, "request head too large")
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            if data.strip():
                raise HttpError(400, "the connection ended inside a request head")
            return b"", b""
        data += chunk
    return data[: end + 4], data[end + 4 :]


async def connect_socket(addresses: Iterable[IPAddress], port: int) -> socket.socket:
    """A raw non-blocking connection to the first of `addresses` that accepts (only
    addresses the proxy checked are ever passed here)."""
    loop = asyncio.get_running_loop()
    last: Exception | None = None
    for address in addresses:
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, (str(address), port)), _CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            sock.close()
            last = exc
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise HttpError(502, f"could not connect: {last}")


async def connect(
    addresses: Iterable[IPAddress], port: int, *, tls: ssl.SSLContext | None = None, server_hostname: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """`connect_socket`, as streams (over TLS to `server_hostname` if `tls` is given)."""
    sock = await connect_socket(addresses, port)
    try:
        return await asyncio.open_connection(
            sock=sock, limit=_READ, ssl=tls, server_hostname=server_hostname if tls else None,
            ssl_handshake_timeout=_TLS_HANDSHAKE_TIMEOUT_S if tls else None,
        )
    except BaseException:
        sock.close()
        raise


async def accepted_streams(
    sock: socket.socket, *, tls: ssl.SSLContext | None = None, already_read: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams over an accepted client socket (the server side of TLS if `tls` is given);
    `already_read` is what was received past the request head, read first."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=HEAD_MAX, loop=loop)
    reader.feed_data(already_read)  # before the transport delivers anything newer
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    # The transport gets a duplicate to own and close; the caller keeps (and closes) `sock`.
    owned = sock.dup()
    try:
        transport, _ = await loop.connect_accepted_socket(
            lambda: protocol, owned, ssl=tls, ssl_handshake_timeout=_TLS_HANDSHAKE_TIMEOUT_S if tls else None
        )
    except BaseException:
        owned.close()
        raise
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def splice(source: socket.socket, sink: socket.socket, count: Count) -> None:
    """Relay `source` to `sink` in the kernel until `source` ends, then half-close `sink`."""
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        try:
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        except OSError:
            pass  # over the per-user pipe quota: the default 64 KiB pipe only costs throughput
        while True:
            try:
                size = os.splice(source.fileno(), write_end, _PIPE_SIZE, flags=_SPLICE_FLAGS)
            except BlockingIOError:
                await _ready(source, readable=True)
                continue
            if not size:
                break
            await count(size)
            while size:
                try:
                    size -= os.splice(read_end, sink.fileno(), size, flags=_SPLICE_FLAGS)
                except BlockingIOError:
                    await _ready(sink, readable=False)
        sink.shutdown(socket.SHUT_WR)
    finally:
        os.close(read_end)
        os.close(write_end)


async def _ready(sock: socket.socket, *, readable: bool) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    if readable:
        loop.add_reader(sock.fileno(), wake)
    else:
        loop.add_writer(sock.fileno(), wake)
    try:
        await ready
    finally:
        if readable:
            loop.remove_reader(sock.fileno())
        else:
            loop.remove_writer(sock.fileno())


async def pump(
    source: asyncio.StreamReader,
    sink: asyncio.StreamWriter,
    count: Count,
    transform: Callable[[bytes], bytes] | None = None,
    flush: Callable[[], bytes] | None = None,
) -> None:
    """Relay `source` to `sink` (each piece through `transform`, then `flush` at the end)
    until `source` ends, then half-close `sink` where its transport can."""
    while chunk := await source.read(_READ):
        await count(len(chunk))
        sink.write(transform(chunk) if transform is not None else chunk)
        await sink.drain()
    if flush is not None:
        sink.write(flush())
    if sink.can_write_eof():
        sink.write_eof()


async def run_both(upward: Awaitable[None], downward: Awaitable[None], *, wait_for_reply: bool) -> None:
    """Run both directions of a connection until the server's side ends (or either fails).

    When the client's side ends first, the server's reply is awaited if `wait_for_reply`
    (its end of stream was passed on as a half-close); over TLS, which has none, the
    connection ends with the client's.
    """
    down = asyncio.ensure_future(downward)
    up = asyncio.ensure_future(upward)
    try:
        done, _ = await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
        if up in done:
            up.result()
            if wait_for_reply:
                await down
        if down.done():
            down.result()
    finally:
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)
