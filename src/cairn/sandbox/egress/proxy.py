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
   from Cairn's CA (`ca.py`), re-encrypts to the real host with normal verification,
   substitutes the credentials' placeholders in the requests and puts the placeholder
   back in place of every secret of the session in the responses (`_exchanges.py`), so
   what the sandbox reads never holds one; placeholders of credentials not allowed there
   pass unchanged and are reported, as are any seen in plain HTTP.
What it logs of a connection: session, host, port, decision and byte counts; never a
path, a header or a byte of content.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from functools import partial
from urllib.parse import urlsplit, urlunsplit

from cairn.config import EgressSettings
from cairn.sandbox.egress._exchanges import Exchanges, relay_requests, relay_responses, unencoded
from cairn.sandbox.egress._http import HELD_PER_SESSION, Flow, HeldBytes, HttpError, RequestHead
from cairn.sandbox.egress._relay import accepted_streams, connect, connect_socket, pump, receive_head, run_both, tunnel
from cairn.sandbox.egress.addresses import AddressGuard, IPAddress
from cairn.sandbox.egress.ca import EgressCA
from cairn.sandbox.egress.credentials import SessionEgress
from cairn.sandbox.egress.policy import host_matches, is_host_name, normalize_host, parse_domain_patterns
from cairn.sandbox.egress.reports import EgressEvent, EgressKind, EgressReports
from cairn.sandbox.egress.substitution import Substituter

__all__ = ["EgressProxy", "Refused"]

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 10.0
_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
_CODING = re.compile(r"[a-z0-9.+-]{1,32}")


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
    throttle: _Throttle | None = None
    held: HeldBytes = field(default_factory=lambda: HeldBytes(0))  # a session's, once admitted


class _Throttle:
    """A session's bandwidth: a token bucket of one second's worth, shared by its
    connections (and their tunnels' threads)."""

    def __init__(self, rate: int) -> None:
        self._rate = rate
        self._tokens = float(rate)
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def take(self, size: int) -> float:
        """Spend `size` bytes; the seconds to wait before sending them (0 while in credit)."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self._rate, self._tokens + (now - self._at) * self._rate) - size
            self._at = now
            return max(0.0, -self._tokens / self._rate)


@dataclass(slots=True)
class _Admitted:
    """A session the proxy serves: its policy and credentials (updated by `admit`), and
    what its connections share for as long as it is admitted."""

    egress: SessionEgress
    held: HeldBytes
    throttle: _Throttle | None


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
        self._sessions: dict[str, _Admitted] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Touched on the proxy's loop only.
        self._open: dict[str, int] = {}

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
            admitted = self._sessions.get(egress.session_id)
            if admitted is not None:
                admitted.egress = egress
                return
            rate = self.settings.bandwidth_bytes_s
            self._sessions[egress.session_id] = _Admitted(
                egress, HeldBytes(HELD_PER_SESSION), _Throttle(rate) if rate is not None else None
            )

    def forget(self, session_id: str) -> None:
        """Drop the session's policy and credentials; its connections are refused from now on."""
        with self._lock:
            self._sessions.pop(session_id, None)

    def serve(self, listener: socket.socket, session_id: str) -> Callable[[], None]:
        """Accept `listener`'s connections as `session_id`'s (the proxy owns it from now on);
        returns the function that closes it (thread-safe, idempotent). Blocking."""
        loop = self._running_loop()
        listener.setblocking(False)
        accepting = asyncio.run_coroutine_threadsafe(self._accept(listener, session_id), loop)

        def close() -> None:
            try:
                loop.call_soon_threadsafe(accepting.cancel)
            except RuntimeError:  # the loop is gone (process exit), and the listener with it
                listener.close()

        return close

    def close(self) -> None:
        """Stop the proxy's loop, ending every connection and listener (blocking). A
        process that exits needs no call: the thread is a daemon and the sockets go with it."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            asyncio.run_coroutine_threadsafe(_cancel_everything(), loop).result(_START_TIMEOUT_S)
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

    async def _accept(self, listener: socket.socket, session_id: str) -> None:
        loop = asyncio.get_running_loop()
        connections: set[asyncio.Task[None]] = set()
        try:
            while True:
                client, _ = await loop.sock_accept(listener)
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                task = loop.create_task(self._handle(client, session_id))
                connections.add(task)
                task.add_done_callback(connections.discard)
        finally:
            # A closed door ends its session's connections too (its container is gone).
            listener.close()
            for task in connections:
                task.cancel()

    # -- one connection ---------------------------------------------------------------

    async def _handle(self, client: socket.socket, session_id: str) -> None:
        connection = _Connection(session_id)
        with self._lock:
            admitted = self._sessions.get(session_id)
        session = None
        if admitted is not None:
            session = admitted.egress
            connection.held, connection.throttle = admitted.held, admitted.throttle
        open_now = self._open.get(session_id, 0)
        try:
            if session is None:
                connection.decision = "refused: session not admitted"
                await _answer(client, 403, "this sandbox's session has no network access now")
            elif open_now >= self.settings.max_connections:
                connection.decision = "refused: connection limit"
                await _answer(client, 429, f"more than {self.settings.max_connections} open connections for this session")
            else:
                self._open[session_id] = open_now + 1
                try:
                    await self._proxy(client, session, connection)
                finally:
                    self._open[session_id] -= 1
        except HttpError as exc:
            connection.decision = f"bad request ({exc.status})"
            await _answer(client, exc.status, str(exc))
        except Refused as exc:
            connection.decision = "refused"
            self._report(connection, "network_blocked", str(exc))
            await _answer(client, 403, f"Cairn egress proxy refused {connection.host}:{connection.port}: {exc}")
        except (TimeoutError, OSError, EOFError, ssl.SSLError) as exc:
            # The peer went away or the upstream failed: the connection is over either way.
            connection.decision += f", ended by {type(exc).__name__}"
        except asyncio.CancelledError:
            # Its door closed or the proxy stopped: the connection ends here, as it should.
            connection.decision += ", ended by the proxy"
        finally:
            client.close()
            logger.info(
                "egress session=%s host=%s port=%d decision=%s sent=%d received=%d",
                connection.session_id, connection.host, connection.port, connection.decision,
                connection.sent, connection.received,
            )

    async def _proxy(self, client: socket.socket, session: SessionEgress, connection: _Connection) -> None:
        raw, rest = await receive_head(client)
        if not raw:
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
        if url is not None:
            await self._forward(client, rest, head, url.path, url.query, session, connection, addresses)
            return
        secrets = session.secrets_for(connection.host) if port in self.settings.intercept_ports else ()
        if secrets:
            if rest:
                raise HttpError(400, "data was sent before the tunnel was established")
            others = [secret for secret in session.secrets if secret not in secrets]
            await self._intercept(client, connection, addresses, Substituter.for_requests(secrets, others),
                                  Substituter.for_responses(session.secrets))
            return
        upstream = await connect_socket(addresses, port)
        try:
            connection.decision = "tunnelled"
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(client, _ESTABLISHED)
            if rest:
                await loop.sock_sendall(upstream, rest)
            await tunnel(
                client, upstream, partial(_count, connection, upward=True), partial(_count, connection, upward=False)
            )
        finally:
            upstream.close()

    async def _forward(
        self, client: socket.socket, rest: bytes, head: RequestHead, path: str, query: str,
        session: SessionEgress, connection: _Connection, addresses: list[IPAddress],
    ) -> None:
        """A plain-HTTP request: one per connection, credentials never substituted (and
        their placeholders reported), the session's secrets redacted from the response
        (one a service stored and now serves over plain HTTP)."""
        connection.decision = "forwarded"
        scan = Substituter.for_requests((), session.secrets)
        redactor = Substituter.for_responses(session.secrets)
        up_reader, up_writer = await connect(addresses, connection.port)
        reader, writer = await accepted_streams(client, already_read=rest)
        exchanges = Exchanges()

        async def request() -> None:
            sent = replace(unencoded(head), target=urlunsplit(("", "", path or "/", query, "")))
            exchanges.sent(sent)
            up_writer.write(scan.replace_all(sent.render(drop=("proxy-connection", "proxy-authorization", "connection"),
                                                         add=(("Connection", "close"),))))
            await pump(reader, up_writer, partial(_count, connection, upward=True), scan.feed, scan.flush)

        await self._relay_http(connection, request(), exchanges, up_reader, up_writer, writer, scan, redactor,
                               wait_for_reply=True)

    async def _check(self, session: SessionEgress, host: str) -> list[IPAddress]:
        """The addresses `host` may be reached at, or `Refused`."""
        literal = _ip_literal(host)
        if literal is None and not is_host_name(host):
            raise HttpError(400, f"{host!r} is not a host name")
        refusal = session.policy.refusal(host)
        if refusal is not None:
            raise Refused(refusal)
        addresses = [literal] if literal is not None else await self._resolve(host)
        if host_matches(host, self._allow_private):
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
        self, client: socket.socket, connection: _Connection, addresses: list[IPAddress],
        substituter: Substituter, redactor: Substituter,
    ) -> None:
        connection.decision = "intercepted"
        try:
            up_reader, up_writer = await connect(addresses, connection.port, tls=self._upstream_tls,
                                                 server_hostname=connection.host)
        except ssl.SSLError as exc:
            connection.decision = "refused: upstream TLS failed"
            await _answer(client, 502, f"TLS to {connection.host} failed: {exc.reason or exc}")
            return
        try:
            await asyncio.get_running_loop().sock_sendall(client, _ESTABLISHED)
            reader, writer = await accepted_streams(client, tls=self.ca.server_context(connection.host))
        except BaseException:
            up_writer.close()
            raise
        exchanges = Exchanges()
        requests = Flow(reader, partial(_send, up_writer, connection, upward=True), substituter, "request", 400, connection.held)
        await self._relay_http(connection, relay_requests(requests, exchanges), exchanges, up_reader, up_writer, writer,
                               substituter, redactor, wait_for_reply=False)

    async def _relay_http(
        self, connection: _Connection, requests: Awaitable[None], exchanges: Exchanges,
        up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter, writer: asyncio.StreamWriter,
        substituter: Substituter, redactor: Substituter, *, wait_for_reply: bool,
    ) -> None:
        """Relay a connection whose HTTP the proxy reads (intercepted or plain): `requests`
        going up on `exchanges`, the responses coming down redacted, until it ends; then
        close both sides and report what was replaced."""
        responses = Flow(up_reader, partial(_send, writer, connection, upward=False), redactor, "response", 502, connection.held)
        try:
            await run_both(requests, relay_responses(responses, exchanges, partial(self._report_encoded, connection)),
                           wait_for_reply=wait_for_reply)
        except HttpError as exc:
            connection.decision += f", ended: {exc}"
        finally:
            up_writer.close()
            writer.close()
            self._report_replacements(connection, substituter, redactor)

    def _report_replacements(self, connection: _Connection, substituter: Substituter, redactor: Substituter) -> None:
        """At a connection's end: the placeholders it passed on unchanged, the secrets it redacted."""
        if substituter.unchanged:
            self._report(connection, "credential_withheld", f"a credential placeholder was sent to {connection.host}, "
                         "which that credential is not allowed for; it was passed on unchanged")
        if redactor.replaced:
            self._report(connection, "credential_redacted", f"{redactor.replaced} occurrence(s) of a credential's secret "
                         f"in responses from {connection.host} were replaced by the credential's placeholder")

    def _report_encoded(self, connection: _Connection, coding: str) -> None:
        coding = coding if _CODING.fullmatch(coding) else "(unrecognised)"  # the upstream's text, kept short
        self._report(connection, "response_encoded", f"a response from {connection.host} came with Content-Encoding "
                     f"{coding!r} although the proxy asked for identity; its bytes were scanned for credentials as "
                     "they are, its decoded content was not")

    def _report(self, connection: _Connection, kind: EgressKind, reason: str) -> None:
        self.reports.report(EgressEvent(connection.session_id, kind, connection.host, connection.port, reason))


async def _send(sink: asyncio.StreamWriter, connection: _Connection, data: bytes, *, upward: bool) -> None:
    """Send `data` on one direction of an intercepted connection, counted and paced."""
    if delay := _count(connection, len(data), upward=upward):
        await asyncio.sleep(delay)
    sink.write(data)
    await sink.drain()


def _count(connection: _Connection, size: int, *, upward: bool) -> float:
    """Count `size` bytes of `connection` (from any thread: each direction has one writer);
    the seconds to wait for the session's bandwidth limit."""
    if upward:
        connection.sent += size
    else:
        connection.received += size
    return connection.throttle.take(size) if connection.throttle is not None else 0.0


async def _cancel_everything() -> None:
    """End every connection of the running loop (but the caller) and wait for them."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _answer(client: socket.socket, status: int, reason: str) -> None:
    """Answer the client with an error and a one-line reason (best effort: it may be gone)."""
    body = (reason + "\n").encode()
    phrase = {400: "Bad Request", 403: "Forbidden", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
              501: "Not Implemented", 502: "Bad Gateway"}.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nX-Cairn-Egress: refused\r\n\r\n"
    ).encode()
    try:
        await asyncio.get_running_loop().sock_sendall(client, head + body)
    except OSError as exc:
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
