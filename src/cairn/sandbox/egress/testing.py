"""A local upstream for egress tests and benchmarks: an HTTP(S) server that records what
it receives.

`LocalUpstream` listens on 127.0.0.1 (the proxy reaches it only through the operator's
`allow_private` names and the test resolver map), with a certificate from its own test
CA (`ca_file`, what `CAIRN_EGRESS_UPSTREAM_CA` points the proxy at). Every request's
host, method, path, headers and body are kept in `received`; `GET /bytes/<n>` answers
`n` bytes (downloads for the benchmark); `/status/<code>` answers that status without a
body; `/echo` answers the request's headers (`Name: value` lines), a blank line and its
body, and its Authorization header in `X-Echo-Authorization` (a service that reflects
what it got, for the proxy's redaction), shaped by its query: `repeat=<n>` repeats the
echo, `chunked=<size>` sends it chunked in pieces of that size with the Authorization
header again as a trailer, `close=1` delimits it by closing the connection, `gzip=1`
compresses it (`Content-Encoding: gzip`), `early=1` sends a `103 Early Hints` first;
`/malformed` answers a response that does not parse; everything else answers `ok`.
"""

from __future__ import annotations

import datetime
import gzip
import ipaddress
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["LocalUpstream", "ReceivedRequest", "local_upstream"]

_BLOCK = b"\0" * (1024 * 1024)


@dataclass(frozen=True, slots=True)
class ReceivedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class LocalUpstream:
    def __init__(self, *, names: tuple[str, ...], directory: Path, tls: bool) -> None:
        self.received: list[ReceivedRequest] = []
        self.ca_file = directory / "upstream-ca.pem"
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                """Quiet: the tests look at `received`."""

            def setup(self) -> None:
                super().setup()
                # Head and body go out in separate writes: without this, Nagle's algorithm
                # and the client's delayed ACK add 40 ms to every answer.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                upstream.received.append(ReceivedRequest(self.command, self.path, dict(self.headers.items()), body))
                if self.path.startswith("/bytes/"):
                    size = int(self.path.rsplit("/", 1)[1])
                    self.send_response(200)
                    self.send_header("Content-Length", str(size))
                    self.end_headers()
                    while size:
                        piece = _BLOCK[: min(size, len(_BLOCK))]
                        self.wfile.write(piece)
                        size -= len(piece)
                    return
                if self.path.startswith("/status/"):
                    self.send_response(int(self.path.rsplit("/", 1)[1]))
                    self.end_headers()
                    return
                if self.path.startswith("/echo"):
                    self._echo(body)
                    return
                if self.path == "/malformed":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\nok\n")
                    self.close_connection = True
                    return
                self.send_response(200)
                self.send_header("Content-Length", "3")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(b"ok\n")

            def _echo(self, body: bytes) -> None:
                query = {name: values[-1] for name, values in parse_qs(urlsplit(self.path).query).items()}
                authorization = self.headers.get("Authorization", "")
                echo = "".join(f"{name}: {value}\n" for name, value in self.headers.items()).encode() + b"\n" + body
                echo *= int(query.get("repeat", "1"))
                if query.get("early"):
                    self.send_response_only(103)
                    self.send_header("X-Early-Authorization", authorization)
                    self.end_headers()
                self.send_response(200)
                self.send_header("X-Echo-Authorization", authorization)
                if query.get("gzip"):
                    echo = gzip.compress(echo)
                    self.send_header("Content-Encoding", "gzip")
                if size := int(query.get("chunked", "0")):
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for start in range(0, len(echo), size):
                        piece = echo[start : start + size]
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.flush()
                    self.wfile.write(f"0\r\nX-Trailer-Authorization: {authorization}\r\n\r\n".encode())
                    return
                if query.get("close"):
                    self.send_header("Connection", "close")
                    self.close_connection = True
                else:
                    self.send_header("Content-Length", str(len(echo)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(echo)

            do_GET = do_POST = do_PUT = do_HEAD = _answer

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        chain = _issue(names, directory, self.ca_file)
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(chain)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="local-upstream", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def local_upstream(*names: str, tls: bool = True) -> Iterator[LocalUpstream]:
    """A `LocalUpstream` whose certificate is valid for `names` (and 127.0.0.1)."""
    with tempfile.TemporaryDirectory(prefix="cairn-upstream-") as directory:
        upstream = LocalUpstream(names=names, directory=Path(directory), tls=tls)
        try:
            yield upstream
        finally:
            upstream.close()


def _issue(names: tuple[str, ...], directory: Path, ca_file: Path) -> Path:
    """A test CA (written to `ca_file`) and a server certificate for `names` signed by it;
    returns the PEM file holding the server's key and chain."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Cairn test upstream CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in names]
    alt_names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    leaf = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain = directory / "upstream.pem"
    chain.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + leaf.public_bytes(serialization.Encoding.PEM)
    )
    return chain
