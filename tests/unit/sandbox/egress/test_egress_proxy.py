"""The egress proxy on its own: policy, address checks, interception and substitution,
limits and reports, driven over a listener on the host's loopback by a plain client.

The sandbox-level tests (test_egress_sandbox.py) run the same proxy behind real bwrap
containers; these pin down what it decides, byte for byte.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import anyio
import pytest

from cairn.sandbox.egress import (
    EgressCA,
    EgressEvent,
    EgressProxy,
    EgressSettings,
    NetworkPolicy,
    SessionEgress,
    WireSecret,
    _http,
)
from cairn.sandbox.egress.testing import LocalUpstream, local_upstream
from tests.http_responses import read_responses
from tests.waits import until_blocking

SECRET = "s3cr3t-value-that-must-only-reach-the-api"
PLACEHOLDER = "cairn_placeholder_7f3a9c0d2e1b4a6f"
ALLOWED = "api.test"
OTHER = "other.test"


@pytest.fixture
def upstream() -> Iterator[LocalUpstream]:
    with local_upstream(ALLOWED, OTHER, "www.allowed.test", "blocked.allowed.test") as server:
        yield server


@pytest.fixture
def plain_upstream() -> Iterator[LocalUpstream]:
    with local_upstream(ALLOWED, tls=False) as server:
        yield server


ProxyFactory = Callable[..., EgressProxy]


@pytest.fixture
def make_proxy() -> Iterator[ProxyFactory]:
    """Makes proxies to the test upstreams (keyword arguments override settings); closes them after."""
    made: list[EgressProxy] = []

    def make(upstream: LocalUpstream, **overrides: object) -> EgressProxy:
        names = (ALLOWED, OTHER, "www.allowed.test", "blocked.allowed.test", "evil.test", "metadata.test")
        settings = EgressSettings(
            allow_private=frozenset({ALLOWED, OTHER, "www.allowed.test", "blocked.allowed.test"}),
            hosts={**{name: "127.0.0.1" for name in names}, "metadata.test": "169.254.169.254"},
            upstream_ca=upstream.ca_file,
            **overrides,  # type: ignore[arg-type]
        )
        made.append(EgressProxy(settings, EgressCA.ephemeral()))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()


class Door:
    """A session's door to the proxy, on the host's loopback (the sandbox tests use the real one)."""

    def __init__(self, proxy: EgressProxy, egress: SessionEgress) -> None:
        proxy.admit(egress)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        self.port = listener.getsockname()[1]
        self.proxy = proxy
        self.close = proxy.serve(listener, egress.session_id)

    def get(self, url: str, *, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """A plain-HTTP request through the proxy (absolute URL)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request("GET", url, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def https(
        self, host: str, port: int, *, method: str = "GET", path: str = "/", body: bytes | None = None,
        headers: dict[str, str] | None = None, trust: str | None = None,
    ) -> tuple[int, bytes]:
        """An HTTPS request through a CONNECT tunnel, trusting the proxy's CA and `trust`."""
        context = ssl.create_default_context(cadata=self.proxy.ca.certificate_pem.decode())
        if trust is not None:
            context.load_verify_locations(cafile=trust)
        connection = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=context)
        connection.set_tunnel(host, port)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def pipeline(self, host: str, port: int, requests: list[bytes]) -> bytes:
        """Send `requests` at once on one intercepted connection (keep-alive, pipelined) and
        read what comes back until the connection ends."""
        context = ssl.create_default_context(cadata=self.proxy.ca.certificate_pem.decode())
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as raw:
            raw.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\n\r\n".encode())
            assert raw.recv(1024).startswith(b"HTTP/1.1 200")
            with context.wrap_socket(raw, server_hostname=host) as client:
                client.sendall(b"".join(requests))
                return receive_all(client)

    def connect(self, target: str) -> bytes:
        """The proxy's answer to `CONNECT target`."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as client:
            client.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            return client.recv(65536)


def session(policy: NetworkPolicy | None = None, *secrets: WireSecret) -> SessionEgress:
    return SessionEgress("sess_proxytest", policy or NetworkPolicy("enabled"), secrets)


def credential(allowed_hosts: tuple[str, ...] | None = (ALLOWED,)) -> WireSecret:
    return WireSecret("cred_1", "API_KEY", PLACEHOLDER, SECRET, allowed_hosts)


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("[::1]", "loopback"),
        ("169.254.169.254", "link-local"),
        ("10.1.2.3", "private"),
        ("192.168.0.1", "private"),
        ("172.16.5.4", "private"),
        ("100.64.0.1", "not a public address"),
        ("[fd00::1]", "private"),
        ("[::ffff:127.0.0.1]", "loopback"),
        ("evil.test", "resolves to 127.0.0.1, a loopback address"),
        ("metadata.test", "resolves to 169.254.169.254, a link-local"),
    ],
)
def test_private_destinations_are_refused_with_a_reason(make_proxy: ProxyFactory, upstream: LocalUpstream, target: str, why: str) -> None:
    door = Door(make_proxy(upstream), session())
    try:
        answer = door.connect(f"{target}:{upstream.port}")
        status, body = door.get(f"http://{target}:{upstream.port}/")
    finally:
        door.close()
    assert answer.startswith(b"HTTP/1.1 403 ") and why.encode() in answer
    assert status == 403 and why.encode() in body
    assert upstream.received == []


def test_the_hosts_own_addresses_are_refused(make_proxy: ProxyFactory, upstream: LocalUpstream) -> None:
    from cairn.sandbox.egress.addresses import host_addresses

    own = [address for address in host_addresses() if address.version == 4 and not address.is_loopback]
    if not own:
        pytest.skip("this host has no IPv4 address besides loopback")
    door = Door(make_proxy(upstream), session())
    try:
        answer = door.connect(f"{own[0]}:{upstream.port}")
    finally:
        door.close()
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert upstream.received == []


def test_an_allowed_private_name_is_reached_and_tunnelled_untouched(make_proxy: ProxyFactory, upstream: LocalUpstream) -> None:
    # No credential is allowed for api.test: the TLS goes end to end, the client must
    # trust the upstream's own CA, and the placeholder arrives as sent.
    door = Door(make_proxy(upstream), session(None, credential(allowed_hosts=(OTHER,))))
    try:
        status, body = door.https(ALLOWED, upstream.port, headers={"Authorization": f"Bearer {PLACEHOLDER}"},
                                  trust=str(upstream.ca_file))
    finally:
        door.close()
    assert (status, body) == (200, b"ok\n")
    assert upstream.received[-1].headers["Authorization"] == f"Bearer {PLACEHOLDER}"


class RawUpstream:
    """A TCP server for one connection that answers what it read, once the client's side ended."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(10)
        self.port = self._listener.getsockname()[1]
        self.got_eof = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        connection, _ = self._listener.accept()
        with connection:
            received = b""
            while chunk := connection.recv(65536):
                received += chunk
            self.got_eof.set()
            connection.sendall(b"you sent " + str(len(received)).encode())

    def close(self) -> None:
        self._thread.join(timeout=10)
        self._listener.close()


def tunnel_to(door: Door, port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", door.port), timeout=10)
    client.sendall(f"CONNECT {ALLOWED}:{port} HTTP/1.1\r\n\r\n".encode())
    assert client.recv(1024).startswith(b"HTTP/1.1 200")
    return client


def receive_all(client: socket.socket) -> bytes:
    data = b""
    while chunk := client.recv(65536):
        data += chunk
    return data


def test_a_tunnel_passes_the_clients_end_on_and_still_delivers_the_reply(make_proxy: ProxyFactory, upstream: LocalUpstream) -> None:
    raw = RawUpstream()
    door = Door(make_proxy(upstream), session())
    try:
        with tunnel_to(door, raw.port) as client:
            client.sendall(b"x" * 3_000_000)
            client.shutdown(socket.SHUT_WR)
            assert receive_all(client) == b"you sent 3000000"
    finally:
        door.close()
        raw.close()


def test_closing_a_sessions_door_ends_its_open_tunnels(make_proxy: ProxyFactory, upstream: LocalUpstream) -> None:
    raw = RawUpstream()
    door = Door(make_proxy(upstream), session())
    try:
        with tunnel_to(door, raw.port) as client:
            client.sendall(b"still talking")
            door.close()
            # Both ends learn it is over: the client reads the end, the upstream its EOF.
            assert receive_all(client) == b""
            assert raw.got_eof.wait(10), "the upstream never saw the tunnel end"
    finally:
        door.close()
        raw.close()


def test_a_tunnel_without_a_thread_ends_and_the_proxy_goes_on(make_proxy: ProxyFactory, upstream: LocalUpstream,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    from cairn.sandbox.egress import _relay

    class NoThreads(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    door = Door(make_proxy(upstream), session())
    caplog.set_level(logging.INFO, logger="cairn.sandbox.egress.proxy")
    try:
        monkeypatch.setattr(_relay.threading, "Thread", NoThreads)
        with tunnel_to(door, upstream.port) as client:
            assert receive_all(client) == b""  # ended, not hung
        until_blocking(lambda: "ended by OSError" in caplog.text, "the ended tunnel's log line")
        monkeypatch.undo()
        status, body = door.https(ALLOWED, upstream.port, trust=str(upstream.ca_file))
    finally:
        door.close()
    assert (status, body) == (200, b"ok\n")


def test_a_tunnel_keeps_to_the_sessions_bandwidth(make_proxy: ProxyFactory, upstream: LocalUpstream,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    raw = RawUpstream()
    door = Door(make_proxy(upstream, bandwidth_bytes_s=64 * 1024), session())
    caplog.set_level(logging.INFO, logger="cairn.sandbox.egress.proxy")
    try:
        with tunnel_to(door, raw.port) as client:
            started = time.monotonic()
            client.sendall(b"x" * 160 * 1024)
            client.shutdown(socket.SHUT_WR)
            assert receive_all(client) == b"you sent 163840"
            elapsed = time.monotonic() - started
    finally:
        door.close()
        raw.close()
    # 64 KiB are in the bucket; the other 96 KiB owe 1.5 s at 64 KiB/s.
    assert elapsed >= 1.4
    line = until_blocking(lambda: next((r.getMessage() for r in caplog.records if "decision=tunnelled" in r.getMessage()), None),
                          "the tunnel's log line")
    assert "sent=163840" in line and "received=15" in line


def test_restricted_allows_exactly_its_domains_minus_the_blocked(make_proxy: ProxyFactory, plain_upstream: LocalUpstream) -> None:
    upstream = plain_upstream
    policy = NetworkPolicy("restricted", allowed_domains=(ALLOWED, "*.allowed.test"),
                           blocked_domains=("blocked.allowed.test",))
    door = Door(make_proxy(upstream), session(policy))
    try:
        answers = {host: door.get(f"http://{host}:{upstream.port}/") for host in
                   (ALLOWED, "www.allowed.test", "blocked.allowed.test", OTHER)}
    finally:
        door.close()
    assert answers[ALLOWED][0] == 200 and answers["www.allowed.test"][0] == 200
    assert answers["blocked.allowed.test"] == (403, answers["blocked.allowed.test"][1])
    assert b"blocked_domains" in answers["blocked.allowed.test"][1]
    assert answers[OTHER][0] == 403 and b"not in the session's allowed_domains" in answers[OTHER][1]
    assert len(upstream.received) == 2


def test_the_secret_replaces_the_placeholder_for_an_allowed_host(make_proxy: ProxyFactory, upstream: LocalUpstream,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    # The upstream cannot listen on 443: the test proxy intercepts its port instead.
    proxy = make_proxy(upstream, intercept_ports=(upstream.port,))
    door = Door(proxy, session(None, credential()))
    caplog.set_level(logging.DEBUG)
    body = f'{{"key": "{PLACEHOLDER}", "again": "{PLACEHOLDER}"}}'.encode()
    try:
        status, _ = door.https(ALLOWED, upstream.port, method="POST", body=body,
                               headers={"Authorization": f"Bearer {PLACEHOLDER}", "Content-Type": "application/json"})
    finally:
        door.close()
    assert status == 200
    received = upstream.received[-1]
    assert received.headers["Authorization"] == f"Bearer {SECRET}"
    assert received.body == f'{{"key": "{SECRET}", "again": "{SECRET}"}}'.encode()
    assert received.headers["Content-Length"] == str(len(received.body))
    until_blocking(lambda: "decision=intercepted" in caplog.text, "the connection to be logged")
    assert SECRET not in caplog.text and PLACEHOLDER not in caplog.text


def test_a_placeholder_sent_elsewhere_goes_unchanged_and_is_reported(make_proxy: ProxyFactory, 
    upstream: LocalUpstream, plain_upstream: LocalUpstream
) -> None:
    proxy = make_proxy(upstream, intercept_ports=(upstream.port,))
    other = WireSecret("cred_2", "OTHER_KEY", "cairn_placeholder_other_0123456789", "other-secret", (OTHER,))
    door = Door(proxy, session(None, credential(), other))
    try:
        status, _ = door.https(ALLOWED, upstream.port, headers={"X-Other": other.placeholder})
        plain, _ = door.get(f"http://{ALLOWED}:{plain_upstream.port}/", headers={"X-Key": PLACEHOLDER})
    finally:
        door.close()
    assert status == 200 and plain == 200
    assert upstream.received[0].headers["X-Other"] == other.placeholder
    assert plain_upstream.received[0].headers["X-Key"] == PLACEHOLDER  # plain HTTP: never substituted
    kinds = until_blocking(lambda: [e for e in drain(proxy) if e.kind == "credential_withheld"] or None,
                           "the withheld credentials to be reported")
    assert {event.host for event in kinds} >= {ALLOWED}


def intercepting(make_proxy: ProxyFactory, upstream: LocalUpstream, *secrets: WireSecret) -> Door:
    """A door to a proxy that intercepts the upstream's port, for a session with `secrets`
    (by default the credential allowed for api.test)."""
    return Door(make_proxy(upstream, intercept_ports=(upstream.port,)), session(None, *(secrets or (credential(),))))


BEARER = {"Authorization": f"Bearer {PLACEHOLDER}"}


def test_an_echo_of_the_credential_comes_back_as_its_placeholder(make_proxy: ProxyFactory, upstream: LocalUpstream,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    # Another credential's secret, which the sandbox could have had the service store
    # earlier, is redacted too: every secret of the session, not only this host's.
    other = WireSecret("cred_2", "OTHER_KEY", "cairn_placeholder_other_0123456789", "other-secret-value", (OTHER,))
    door = intercepting(make_proxy, upstream, credential(), other)
    caplog.set_level(logging.INFO)
    body = f"key={PLACEHOLDER}&stored=other-secret-value".encode()
    try:
        status, echo = door.https(ALLOWED, upstream.port, method="POST", path="/echo", body=body,
                                  headers={**BEARER, "Accept-Encoding": "gzip, br"})
        received = upstream.received[-1]
    finally:
        door.close()
    assert received.headers["Authorization"] == f"Bearer {SECRET}" and received.body == f"key={SECRET}&stored=other-secret-value".encode()
    assert received.headers["Accept-Encoding"] == "identity"
    assert status == 200 and SECRET.encode() not in echo and b"other-secret-value" not in echo
    assert f"Authorization: Bearer {PLACEHOLDER}\n".encode() in echo
    assert echo.endswith(f"\n\nkey={PLACEHOLDER}&stored={other.placeholder}".encode())
    events = until_blocking(lambda: [e for e in drain(door.proxy) if e.kind == "credential_redacted"] or None,
                            "the redactions to be reported")
    assert [(e.host, e.port) for e in events] == [(ALLOWED, upstream.port)] and "4 occurrence(s)" in events[0].reason  # header, body twice, other
    assert SECRET not in caplog.text


def test_a_secret_served_over_plain_http_comes_back_as_its_placeholder(make_proxy: ProxyFactory,
                                                                        plain_upstream: LocalUpstream) -> None:
    # The secret as a service would hold it after an intercepted request stored it (sent
    # here by the test itself, which knows it): served back over plain HTTP, it is redacted.
    door = Door(make_proxy(plain_upstream), session(None, credential()))
    try:
        status, echo = door.get(f"http://{ALLOWED}:{plain_upstream.port}/echo?chunked=5", headers={"X-Stored": SECRET})
    finally:
        door.close()
    assert status == 200 and SECRET.encode() not in echo and f"X-Stored: {PLACEHOLDER}\n".encode() in echo
    assert plain_upstream.received[-1].headers["Accept-Encoding"] == "identity"
    events = until_blocking(lambda: [e for e in drain(door.proxy) if e.kind == "credential_redacted"] or None,
                            "the redaction to be reported")
    assert events[0].port == plain_upstream.port


def echo_through(door: Door, upstream: LocalUpstream, path: str) -> tuple[int, bytes]:
    """GET `path` from the intercepted upstream with the placeholder as a bearer token; closes the door."""
    try:
        return door.https(ALLOWED, upstream.port, path=path, headers=BEARER)
    finally:
        door.close()


def test_a_secret_split_across_chunks_is_redacted(make_proxy: ProxyFactory, upstream: LocalUpstream) -> None:
    status, echo = echo_through(intercepting(make_proxy, upstream), upstream, "/echo?chunked=7&repeat=3")
    assert status == 200 and SECRET.encode() not in echo
    assert echo.count(f"Bearer {PLACEHOLDER}".encode()) == 3


def test_a_large_echo_streams_as_chunked_and_redacted(make_proxy: ProxyFactory, upstream: LocalUpstream,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_http, "BUFFERED_BODY_MAX", 1024)
    door = intercepting(make_proxy, upstream)
    try:
        [(status, headers, echo, _)] = read_responses(door.pipeline(ALLOWED, upstream.port, [
            f"GET /echo?repeat=200 HTTP/1.1\r\nHost: {ALLOWED}\r\nAuthorization: Bearer {PLACEHOLDER}\r\n"
            "Connection: close\r\n\r\n".encode(),
        ]), ["GET"])
    finally:
        door.close()
    assert status == 200 and headers["transfer-encoding"] == "chunked" and "content-length" not in headers
    assert len(echo) > 1024 and SECRET.encode() not in echo and echo.count(PLACEHOLDER.encode()) == 200
    assert headers["x-echo-authorization"] == f"Bearer {PLACEHOLDER}"


def test_pipelined_requests_get_their_responses_framed_and_redacted(make_proxy: ProxyFactory,
                                                                     upstream: LocalUpstream) -> None:
    # HEAD, 204, an interim 103 and a close-delimited answer on one keep-alive connection,
    # sent at once: each response is paired with its request's method, in order.
    auth = f"Authorization: Bearer {PLACEHOLDER}\r\n"
    requests = [
        ("GET", "/echo", ""), ("HEAD", "/echo", ""), ("GET", "/status/204", ""),
        ("POST", "/echo?chunked=5", "Content-Length: 4\r\n\r\nbody"), ("GET", "/echo?early=1", ""),
        ("GET", "/echo?close=1", ""),
    ]
    raw = [f"{method} {path} HTTP/1.1\r\nHost: {ALLOWED}\r\n{auth}{rest or chr(13) + chr(10)}".encode()
           for method, path, rest in requests]
    door = intercepting(make_proxy, upstream)
    try:
        sent = door.pipeline(ALLOWED, upstream.port, raw)
    finally:
        door.close()
    assert SECRET.encode() not in sent
    responses = read_responses(sent, [method for method, _, _ in requests])
    assert [(status, bool(body)) for status, _, body, _ in responses] == [
        (200, True), (200, False), (204, False), (200, True), (103, False), (200, True), (200, True),
    ]
    for _, headers, body, _ in responses:
        assert headers.get("x-echo-authorization", headers.get("x-early-authorization")) in (None, f"Bearer {PLACEHOLDER}")
        assert not body or f"Authorization: Bearer {PLACEHOLDER}".encode() in body
    assert responses[3][2].endswith(b"\n\nbody")
    assert [request.method for request in upstream.received] == [method for method, _, _ in requests]


def test_a_compressed_response_passes_and_is_reported(make_proxy: ProxyFactory, upstream: LocalUpstream) -> None:
    door = intercepting(make_proxy, upstream)
    status, echo = echo_through(door, upstream, "/echo?gzip=1")
    # The proxy asked for identity; the upstream compressed anyway: its bytes pass as they
    # are (no literal secret in them), the decoded content unscanned, and the session is told.
    assert status == 200 and gzip.decompress(echo).startswith(b"Host: ")
    events = until_blocking(lambda: [e for e in drain(door.proxy) if e.kind == "response_encoded"] or None,
                            "the encoded response to be reported")
    assert "'gzip'" in events[0].reason


def test_a_malformed_response_ends_the_connection(make_proxy: ProxyFactory, upstream: LocalUpstream,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    door = intercepting(make_proxy, upstream)
    caplog.set_level(logging.INFO, logger="cairn.sandbox.egress.proxy")
    try:
        sent = door.pipeline(ALLOWED, upstream.port, [f"GET /malformed HTTP/1.1\r\nHost: {ALLOWED}\r\n\r\n".encode()])
    finally:
        door.close()
    assert sent == b""
    line = until_blocking(lambda: next((r.getMessage() for r in caplog.records if "decision=intercepted" in r.getMessage()), None),
                          "the connection's log line")
    assert "ended: malformed response: bad Content-Length" in line


def test_refusals_are_reported_once_per_destination(make_proxy: ProxyFactory, upstream: LocalUpstream) -> None:
    proxy = make_proxy(upstream)
    door = Door(proxy, session())
    try:
        for _ in range(5):
            door.connect("10.0.0.1:80")
    finally:
        door.close()
    events = until_blocking(lambda: drain(proxy), "the refusal to be reported")
    assert [(e.kind, e.host, e.port) for e in events] == [("network_blocked", "10.0.0.1", 80)]
    assert "private" in events[0].reason


def test_a_session_over_its_connection_limit_gets_429(make_proxy: ProxyFactory, upstream: LocalUpstream) -> None:
    door = Door(make_proxy(upstream, max_connections=1), session())
    held = socket.create_connection(("127.0.0.1", door.port), timeout=10)
    try:
        held.sendall(f"CONNECT {ALLOWED}:{upstream.port} HTTP/1.1\r\n\r\n".encode())
        assert held.recv(1024).startswith(b"HTTP/1.1 200")
        assert door.connect(f"{ALLOWED}:{upstream.port}").startswith(b"HTTP/1.1 429 ")
    finally:
        held.close()
        door.close()


def test_an_unknown_session_is_refused(make_proxy: ProxyFactory, upstream: LocalUpstream) -> None:
    proxy = make_proxy(upstream)
    door = Door(proxy, session())
    proxy.forget("sess_proxytest")
    try:
        assert door.connect(f"{ALLOWED}:{upstream.port}").startswith(b"HTTP/1.1 403 ")
    finally:
        door.close()


def drain(proxy: EgressProxy) -> list[EgressEvent]:
    """The events queued so far (the queue the worker reads)."""

    async def take() -> list[EgressEvent]:
        with anyio.move_on_after(0.05):
            return await proxy.reports.next_batch()
        return []

    return anyio.run(take)


def test_a_sessions_bandwidth_is_paced_by_its_token_bucket() -> None:
    from cairn.sandbox.egress.proxy import _Throttle

    throttle = _Throttle(1024)
    waits = [throttle.take(1024) for _ in range(3)]
    # The first second's worth is in the bucket; the next two KiB are owed. The waits are
    # not slept here, so the last one is (almost) the whole debt: 2 s.
    assert waits[0] == 0.0 and 0.9 <= waits[1] <= 1.0 and 1.9 <= waits[2] <= 2.0
