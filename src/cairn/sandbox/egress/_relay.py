"""Moving a proxied connection's bytes: on threads of their own where the proxy need not
look at them, through asyncio streams where it must.

A tunnel (CONNECT to a host without credentials) is relayed by two threads, one per
direction, with blocking sockets: the proxy's event loop is not in the data path, so a
download keeps most of a direct connection's throughput. Interception and plain-HTTP
forwarding read what they relay (substitution, the placeholder scan) and use asyncio
streams instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterable

from cairn.sandbox.egress._http import HEAD_MAX, HttpError
from cairn.sandbox.egress.addresses import IPAddress

__all__ = ["Count", "accepted_streams", "connect", "connect_socket", "pump", "receive_head", "run_both", "tunnel"]

# Counts a direction's bytes (from any thread); returns the seconds to wait before
# sending them, to keep the session under its bandwidth limit.
Count = Callable[[int], float]

_READ = 1024 * 1024
_TUNNEL_BUFFER = 256 * 1024
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


async def tunnel(client: socket.socket, upstream: socket.socket, up: Count, down: Count) -> None:
    """Relay a tunnel both ways until the upstream's side ends (or either fails); the
    client's end of stream is passed on as a half-close and the reply still awaited.

    Each direction runs on a thread of its own over blocking duplicates of the two
    sockets, copying through one buffer: a download costs two system calls per few
    hundred KB and no event-loop turns (docs/decisions.md, "A tunnel's bytes"). The
    caller keeps and closes its sockets; on the way out they are shut down, which wakes
    both threads, so none outlives the connection by more than a system call.
    """
    stop = threading.Event()
    for sock in (client, upstream):
        sock.setblocking(True)  # the file's mode, shared with the threads' duplicates
    try:
        upward = _copy_on_thread(client, upstream, up, stop)
        downward = _copy_on_thread(upstream, client, down, stop)
        await run_both(upward, downward, wait_for_reply=True)
    finally:
        stop.set()
        for sock in (client, upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _copy_on_thread(source: socket.socket, sink: socket.socket, count: Count, stop: threading.Event) -> asyncio.Future[None]:
    """Start copying `source` to `sink` on a daemon thread (over duplicates it owns); the
    future settles when it ends, and is left alone if it was cancelled meanwhile."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    duplicates = (source.dup(), sink.dup())

    def settle(error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    def run() -> None:
        error: BaseException | None = None
        try:
            _copy(*duplicates, count, stop)
        except BaseException as exc:  # handed to the loop: the connection's task reports it
            error = exc
        try:
            loop.call_soon_threadsafe(settle, error)
        except RuntimeError:
            pass  # the proxy's loop is closed: nobody waits for this connection any more

    try:
        threading.Thread(target=run, name="cairn-egress-tunnel", daemon=True).start()
    except RuntimeError as exc:  # out of threads: the tunnel ends, the proxy goes on
        for sock in duplicates:
            sock.close()
        raise OSError(f"cannot start a thread for the tunnel: {exc}") from exc
    return future


def _copy(source: socket.socket, sink: socket.socket, count: Count, stop: threading.Event) -> None:
    """One direction of a tunnel until `source` ends; then half-close `sink`. Closes both."""
    with source, sink:
        buffer = memoryview(bytearray(_TUNNEL_BUFFER))
        while size := source.recv_into(buffer):
            delay = count(size)
            if delay and stop.wait(delay):
                return
            sink.sendall(buffer[:size])
        sink.shutdown(socket.SHUT_WR)


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
        if delay := count(len(chunk)):
            await asyncio.sleep(delay)
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
