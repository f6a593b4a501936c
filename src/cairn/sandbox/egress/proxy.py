"""Cairn's egress proxy: the only way out of a sandbox that has network.

One per sandbox backend, so one per worker process, shared by its sandboxes. It runs its
own asyncio event loop on a daemon thread, so relaying bytes never competes with the
worker's loop for turns of its own, and the sandbox backend can hand it listeners from
any thread. Each sandbox reaches it through a listener in the sandbox's own network
namespace (`netns.py`) that belongs to one session, so every connection is known to be
that session's.

A connection is an HTTP proxy request: `CONNECT host:port` (HTTPS and any other TCP) or
a plain `http://` URL. The proxy
1. checks the host against the session's policy (`policy.py`), then resolves it once and
   keeps only addresses that are public and not the host's own (`addresses.py`), unless
   the operator allows the name (`CAIRN_EGRESS_ALLOW_PRIVATE`); it connects to an address
   it checked, so a name cannot be re-pointed (DNS rebinding) between check and use;
2. refuses with `403` and a reason, and reports the refusal (`reports.py`, rate-limited)
   for the session's log;
3. tunnels the bytes untouched, or, for HTTPS on 443 and 8443 (the operator may name
   other ports) to a host one of the
   session's credentials is allowed for, intercepts: it terminates TLS with a certificate
   from Cairn's CA (`ca.py`), re-encrypts to the real host with normal verification, and
   substitutes the credentials' placeholders in the requests (`_http.py`); placeholders
   of credentials not allowed there pass unchanged and are reported, as are any seen in
   plain HTTP.
What it logs of a connection: session, host, port, decision and byte counts; never a
path, a header or a byte of content.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from cairn.sandbox.egress._http import HEAD_MAX, HttpError, RequestHead, read_head, relay_requests
from cairn.sandbox.egress.addresses import AddressGuard, IPAddress
from cairn.sandbox.egress.ca import EgressCA
from cairn.sandbox.egress.credentials import SessionEgress
from cairn.sandbox.egress.policy import is_host_name, normalize_host, parse_domain_patterns
from cairn.sandbox.egress.reports import EgressEvent, EgressReports
from cairn.sandbox.egress.settings import EgressSettings
from cairn.sandbox.egress.substitution import Substituter

__all__ = ["EgressProxy", "Refused"]

logger = logging.getLogger(__name__)

_READ = 1024 * 1024
_WRITE_HIGH = 2 * 1024 * 1024
_CONNECT_TIMEOUT_S = 10.0
_START_TIMEOUT_S = 10.0


class Refused(Exception):
    """The policy or the address checks refuse a destination; the message says why."""


@dataclass(slots=True)
class _Connection:
    """One proxied connection, as it is logged."""

    session_id: str
    host: str = "-"
    port: int = 0
    decision: str = "bad request"
    sent: int = 0
    received: int = 0


class _Throttle:
    """A session's bandwidth: a token bucket of one second's worth, shared by its connections."""

    def __init__(self, rate: int) -> None:
        self._rate = rate
        self._tokens = float(rate)
        self._at = time.monotonic()

    async def spend(self, size: int) -> None:
        now = time.monotonic()
        self._tokens = min(self._rate, self._tokens + (now - self._at) * self._rate) - size
        self._at = now
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self._rate)


class EgressProxy:
    """See the module docstring. `admit` and `serve` may be called from any thread."""

    def __init__(self, settings: EgressSettings, ca: EgressCA, reports: EgressReports | None = None) -> None:
        self.settings = settings
        self.ca = ca
        self.reports = reports or EgressReports()
        self._allow_private = frozenset(parse_domain_patterns(settings.allow_private, param="CAIRN_EGRESS_ALLOW_PRIVATE"))
        self._upstream_tls = ssl.create_default_context()
        if settings.upstream_ca is not None:
            self._upstream_tls.load_verify_locations(cafile=str(settings.upstream_ca))
        self._upstream_tls.set_alpn_protocols(["http/1.1"])
        self._guard = AddressGuard()
        self._lock = threading.Lock()
        self._sessions: dict[str, SessionEgress] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Touched on the proxy's loop only.
        self._open: dict[str, int] = {}
        self._throttles: dict[str, _Throttle] = {}

    @property
    def description(self) -> str:
        """How sandboxes with network reach the outside, for `cairn doctor`."""
        allowed = ", ".join(sorted(self._allow_private)) or "none"
        bandwidth = f"{self.settings.bandwidth_bytes_s} bytes/s" if self.settings.bandwidth_bytes_s else "unlimited"
        return (
            "Cairn egress proxy (HTTP CONNECT and http:// on 127.0.0.1:3128 in each sandbox's own network "
            "namespace): public destinations only, restricted sessions only to their allowed_domains; "
            f"private hosts allowed by the operator: {allowed}; per session: {self.settings.max_connections} "
            f"connections, {bandwidth}; credentials substituted in HTTPS to their allowed hosts on ports "
            f"{', '.join(map(str, self.settings.intercept_ports))}"
        )

    def admit(self, egress: SessionEgress) -> None:
        """Set (or update) what the proxy knows of `egress.session_id`."""
        with self._lock:
            self._sessions[egress.session_id] = egress

    def forget(self, session_id: str) -> None:
        """Drop the session's policy and credentials; its connections are refused from now on."""
        with self._lock:
            self._sessions.pop(session_id, None)

    def serve(self, listener: socket.socket, session_id: str) -> Callable[[], None]:
        """Accept `listener`'s connections as `session_id`'s (the proxy owns it from now on);
        returns the function that closes it (thread-safe, idempotent). Blocking."""
        loop = self._running_loop()
        future = asyncio.run_coroutine_threadsafe(self._listen(listener, session_id), loop)
        server = future.result(_START_TIMEOUT_S)

        def close() -> None:
            try:
                loop.call_soon_threadsafe(server.close)
            except RuntimeError:  # the loop is gone (process exit), and the listener with it
                listener.close()

        return close

    def close(self) -> None:
        """Stop the proxy's loop, ending every connection and listener (blocking). A
        process that exits needs no call: the thread is a daemon and the sockets go with it."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="cairn-egress-proxy", daemon=True)
                self._thread.start()
            return self._loop

    async def _listen(self, listener: socket.socket, session_id: str) -> asyncio.Server:
        listener.setblocking(False)

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._handle(reader, writer, session_id)

        return await asyncio.start_server(accepted, sock=listener, limit=HEAD_MAX)

    # -- one connection ---------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, session_id: str) -> None:
        connection = _Connection(session_id)
        with self._lock:
            session = self._sessions.get(session_id)
        open_now = self._open.get(session_id, 0)
        try:
            if session is None:
                connection.decision = "refused: session not admitted"
                await _answer(writer, 403, "this sandbox's session has no network access now")
            elif open_now >= self.settings.max_connections:
                connection.decision = "refused: connection limit"
                await _answer(writer, 429, f"more than {self.settings.max_connections} open connections for this session")
            else:
                self._open[session_id] = open_now + 1
                try:
                    await self._proxy(reader, writer, session, connection)
                finally:
                    self._open[session_id] -= 1
        except HttpError as exc:
            connection.decision = f"bad request ({exc.status})"
            await _answer(writer, exc.status, str(exc))
        except Refused as exc:
            connection.decision = "refused"
            self.reports.report(EgressEvent(session_id, "network_blocked", connection.host, connection.port, str(exc)))
            await _answer(writer, 403, f"Cairn egress proxy refused {connection.host}:{connection.port}: {exc}")
        except (TimeoutError, OSError, EOFError, ssl.SSLError) as exc:
            # The peer went away or the upstream failed: the connection is over either way.
            connection.decision += f", ended by {type(exc).__name__}"
        finally:
            writer.close()
            logger.info(
                "egress session=%s host=%s port=%d decision=%s sent=%d received=%d",
                connection.session_id, connection.host, connection.port, connection.decision,
                connection.sent, connection.received,
            )

    async def _proxy(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, session: SessionEgress, connection: _Connection
    ) -> None:
        raw = await read_head(reader)
        if raw is None:
            connection.decision = "closed before a request"
            return
        head = RequestHead.parse(raw)
        if head.method == "CONNECT":
            host, port = _authority(head.target)
            url = None
        else:
            url = urlsplit(head.target)
            if url.scheme != "http" or not url.hostname:
                raise HttpError(400, "send CONNECT host:port, or an absolute http:// URL")
            host, port = url.hostname, _port(url.port or 80)
        connection.host, connection.port = normalize_host(host), port
        addresses = await self._check(session, connection.host)
        secrets = session.secrets_for(connection.host) if head.method == "CONNECT" and port in self.settings.intercept_ports else ()
        if secrets:
            connection.decision = "intercepted"
            others = [secret for secret in session.secrets if secret not in secrets]
            await self._intercept(reader, writer, connection, addresses, Substituter(secrets, others))
            return
        upstream = await _connect(addresses, port)
        up_reader, up_writer = upstream
        if url is None:
            connection.decision = "tunnelled"
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            scan = None
        else:
            connection.decision = "forwarded"
            scan = Substituter((), session.secrets)  # credentials never go out in plain HTTP
            target = urlunsplit(("", "", url.path or "/", url.query, ""))
            first = head.render(target=target, drop=("proxy-connection", "proxy-authorization", "connection"),
                                add=(("Connection", "close"),))
            up_writer.write(scan.replace_all(first))
        try:
            await self._relay(reader, writer, up_reader, up_writer, connection, scan)
        finally:
            if scan is not None:
                self._report_withheld(connection, scan)

    async def _check(self, session: SessionEgress, host: str) -> list[IPAddress]:
        """The addresses `host` may be reached at, or `Refused`."""
        literal = _ip_literal(host)
        if literal is None and not is_host_name(host):
            raise HttpError(400, f"{host!r} is not a host name")
        refusal = session.policy.refusal(host)
        if refusal is not None:
            raise Refused(refusal)
        addresses = [literal] if literal is not None else await self._resolve(host)
        if host in self._allow_private:
            return addresses
        self._guard.refresh()  # reads /proc at most every 30 s; this is the proxy's own loop
        allowed = [address for address in addresses if self._guard.refusal(address) is None]
        if not allowed:
            what = self._guard.refusal(addresses[0])
            raise Refused(f"{host} is {what}" if literal is not None else f"{host} resolves to {addresses[0]}, {what}")
        return allowed

    async def _resolve(self, host: str) -> list[IPAddress]:
        override = self.settings.hosts.get(host)
        if override is not None:
            return [ipaddress.ip_address(override)]
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise Refused(f"{host} does not resolve ({exc.strerror})") from exc
        return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))

    async def _intercept(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        connection: _Connection,
        addresses: list[IPAddress],
        substituter: Substituter,
    ) -> None:
        try:
            up_reader, up_writer = await _connect(
                addresses, connection.port, ssl=self._upstream_tls, server_hostname=connection.host
            )
        except ssl.SSLError as exc:
            connection.decision = "refused: upstream TLS failed"
            await _answer(writer, 502, f"TLS to {connection.host} failed: {exc.reason or exc}")
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.start_tls(self.ca.server_context(connection.host))

        async def send(data: bytes) -> None:
            if data:
                await self._spend(connection.session_id, len(data))
                connection.sent += len(data)
                up_writer.write(data)
                await up_writer.drain()

        try:
            await _both(
                relay_requests(reader, send, substituter),
                self._pump(up_reader, writer, connection, upstream=False),
                up_writer,
            )
        except HttpError as exc:
            connection.decision += f", bad request ({exc.status})"
        finally:
            up_writer.close()
            self._report_withheld(connection, substituter)

    async def _relay(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        connection: _Connection,
        scan: Substituter | None,
    ) -> None:
        for each in (writer, up_writer):
            each.transport.set_write_buffer_limits(high=_WRITE_HIGH)
        try:
            await _both(
                self._pump(reader, up_writer, connection, upstream=True, scan=scan),
                self._pump(up_reader, writer, connection, upstream=False),
                up_writer,
            )
        finally:
            up_writer.close()

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        connection: _Connection,
        *,
        upstream: bool,
        scan: Substituter | None = None,
    ) -> None:
        while chunk := await source.read(_READ):
            await self._spend(connection.session_id, len(chunk))
            if upstream:
                connection.sent += len(chunk)
                if scan is not None:
                    chunk = scan.feed(chunk)
            else:
                connection.received += len(chunk)
            sink.write(chunk)
            await sink.drain()
        if scan is not None:
            sink.write(scan.flush())
        if sink.can_write_eof():
            sink.write_eof()

    async def _spend(self, session_id: str, size: int) -> None:
        rate = self.settings.bandwidth_bytes_s
        if rate is not None:
            throttle = self._throttles.get(session_id)
            if throttle is None:
                throttle = self._throttles[session_id] = _Throttle(rate)
            await throttle.spend(size)

    def _report_withheld(self, connection: _Connection, substituter: Substituter) -> None:
        if substituter.withheld:
            self.reports.report(EgressEvent(
                connection.session_id, "credential_withheld", connection.host, connection.port,
                f"a credential placeholder was sent to {connection.host}, which that credential is not "
                "allowed for; it was passed on unchanged",
            ))


async def _both(upward: Awaitable[None], downward: Awaitable[None], up_writer: asyncio.StreamWriter) -> None:
    """Run both directions of a connection until the server's side ends.

    The client's end of stream is passed on as a half-close where the transport allows it
    (plain TCP) and the server's reply awaited; over TLS, where it does not, the connection
    ends with the client's.
    """
    down = asyncio.ensure_future(downward)
    up = asyncio.ensure_future(upward)
    try:
        done, _ = await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
        if up in done:
            up.result()
            if up_writer.can_write_eof():
                await down
        if down.done():
            down.result()
    finally:
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)


async def _connect(
    addresses: Iterable[IPAddress], port: int, **tls: object
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the first of `addresses` that accepts one (only checked addresses)."""
    last: Exception | None = None
    for address in addresses:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(str(address), port, limit=_READ, **tls),  # type: ignore[arg-type]
                _CONNECT_TIMEOUT_S,
            )
        except ssl.SSLError:
            raise
        except (TimeoutError, OSError) as exc:
            last = exc
    raise HttpError(502, f"could not connect: {last}")


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    """Answer the client with an error and a one-line reason (best effort: it may be gone)."""
    body = (reason + "\n").encode()
    phrase = {400: "Bad Request", 403: "Forbidden", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
              501: "Not Implemented", 502: "Bad Gateway"}.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nX-Cairn-Egress: refused\r\n\r\n"
    ).encode()
    try:
        writer.write(head + body)
        await writer.drain()
    except (OSError, RuntimeError) as exc:
        logger.debug("could not send the egress proxy's %d answer: %s", status, exc)


def _authority(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise HttpError(400, "CONNECT needs host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, _port(int(port))


def _port(port: int) -> int:
    if not 0 < port < 65536:
        raise HttpError(400, f"port {port} is out of range")
    return port


def _ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
