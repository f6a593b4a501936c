"""The certificate authority the egress proxy signs intercepted hosts' certificates with.

One per data dir, made on first start (`EgressCA.load_or_create`): an ECDSA P-256 key
(fast to use: a leaf is signed per intercepted host) and its certificate in one 0600 file,
`egress-ca/ca.pem`, which is not part of any snapshot (snapshots hold workspaces only). The
certificate is what sandboxes trust (`trust_bundle`); the key never leaves the server's
process. Leaf certificates live in memory only, one per host, valid for a day and re-made
well before they expire. `EgressCA.ephemeral()` keeps everything in memory, for a proxy
without a data dir (tests, `cairn doctor`).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CA_DIR_NAME", "EgressCA"]

CA_DIR_NAME = "egress-ca"
_CA_VALIDITY = datetime.timedelta(days=3650)
_LEAF_VALIDITY = datetime.timedelta(days=1)
_LEAF_RENEW = datetime.timedelta(hours=12)
_LEAF_CACHE = 512


class EgressCA:
    """A CA key and certificate, and the TLS server contexts of the hosts it stands in for."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, certificate: x509.Certificate) -> None:
        self._key = key
        self.certificate = certificate
        self.certificate_pem = certificate.public_bytes(serialization.Encoding.PEM)
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key_pem = self._leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        self._lock = threading.Lock()
        self._contexts: OrderedDict[str, tuple[datetime.datetime, ssl.SSLContext]] = OrderedDict()

    @classmethod
    def ephemeral(cls) -> EgressCA:
        key = ec.generate_private_key(ec.SECP256R1())
        return cls(key, _ca_certificate(key))

    @classmethod
    def load_or_create(cls, data_dir: Path) -> EgressCA:
        """The data dir's CA, made if it has none yet (blocking).

        Key and certificate share one 0600 file, published with a hard link that fails if
        another process published its own first (that one is loaded instead), so two
        workers starting together can never pair one's key with the other's certificate.
        """
        directory = data_dir / CA_DIR_NAME
        path = directory / "ca.pem"
        if not path.exists():
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            key = ec.generate_private_key(ec.SECP256R1())
            pem = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ) + _ca_certificate(key).public_bytes(serialization.Encoding.PEM)
            temporary = directory / f".ca.{os.getpid()}.{os.urandom(4).hex()}.tmp"
            _write_private(temporary, pem)
            try:
                os.link(temporary, path)
            except FileExistsError:
                pass  # another process made the data dir's CA first: use that one
            finally:
                temporary.unlink()
        pem = path.read_bytes()
        loaded = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{path} does not hold an EC private key")
        return cls(loaded, x509.load_pem_x509_certificate(pem))

    def trust_bundle(self, system_bundle: bytes) -> bytes:
        """The system's CA bundle with this CA appended, as sandboxes see it."""
        if system_bundle and not system_bundle.endswith(b"\n"):
            system_bundle += b"\n"
        return system_bundle + self.certificate_pem

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a certificate for `host` signed by this CA."""
        now = datetime.datetime.now(datetime.UTC)
        with self._lock:
            cached = self._contexts.get(host)
            if cached is not None and cached[0] - now > _LEAF_RENEW:
                self._contexts.move_to_end(host)
                return cached[1]
        expires = now + _LEAF_VALIDITY
        context = self._leaf_context(host, now, expires)
        with self._lock:
            self._contexts[host] = (expires, context)
            while len(self._contexts) > _LEAF_CACHE:
                self._contexts.popitem(last=False)
        return context

    def _leaf_context(self, host: str, now: datetime.datetime, expires: datetime.datetime) -> ssl.SSLContext:
        try:
            alt_name: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt_name = x509.DNSName(host)
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.certificate.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(expires)
            .add_extension(x509.SubjectAlternativeName([alt_name]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        chain = leaf.public_bytes(serialization.Encoding.PEM) + self.certificate_pem
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        # load_cert_chain reads files only: a private temporary file, gone at once.
        with tempfile.TemporaryDirectory(prefix="cairn-leaf-") as scratch:
            path = Path(scratch) / "leaf.pem"
            _write_private(path, self._leaf_key_pem + chain)
            context.load_cert_chain(path)
        return context


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Cairn"),
        x509.NameAttribute(NameOID.COMMON_NAME, f"Cairn egress CA {os.urandom(4).hex()}"),
    ])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _write_private(path: Path, content: bytes) -> None:
    """Write `content` to a new file readable by its owner only from the start."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)
