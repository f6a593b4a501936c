"""What a sandbox with network is given to use the egress proxy: its environment and the
CA it trusts.

Programs find the proxy through the usual variables (both cases, since tools disagree on
which they read) and trust Cairn's CA, so that intercepted HTTPS verifies, through the
variables of OpenSSL, curl, requests, git and Node, and through the system bundle path
itself (`/etc/ssl/certs/ca-certificates.crt`, replaced inside the sandbox by the host's
bundle plus Cairn's CA) for programs that read only that.
"""

from __future__ import annotations

import os
from pathlib import Path

from cairn.sandbox.egress.ca import EgressCA
from cairn.sandbox.egress.netns import PROXY_PORT

__all__ = ["BUNDLE_PATH", "CA_PATH", "CA_DIR", "SYSTEM_BUNDLE", "proxy_env", "trust_files"]

CA_DIR = "/etc/cairn"
CA_PATH = f"{CA_DIR}/egress-ca.pem"
BUNDLE_PATH = f"{CA_DIR}/ca-bundle.pem"
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Destinations no program should send to the proxy: the sandbox's own loopback.
NO_PROXY = "localhost,127.0.0.1,::1"


def proxy_env() -> dict[str, str]:
    """The variables every command of a sandbox with network gets."""
    proxy = f"http://127.0.0.1:{PROXY_PORT}"
    env: dict[str, str] = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = proxy
    env["NO_PROXY"] = env["no_proxy"] = NO_PROXY
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"):
        env[name] = BUNDLE_PATH
    env["NODE_EXTRA_CA_CERTS"] = CA_PATH
    return env


def trust_files(ca: EgressCA, system_bundle: Path = Path(SYSTEM_BUNDLE)) -> tuple[dict[str, bytes], bytes | None]:
    """The files to create in the sandbox (path -> content), and the content that replaces
    the system bundle (None if the host has no bundle there as a plain file to cover).
    Blocking: reads the host's bundle."""
    try:
        host_bundle = system_bundle.read_bytes()
    except FileNotFoundError:
        host_bundle = b""
    bundle = ca.trust_bundle(host_bundle)
    files = {CA_PATH: ca.certificate_pem, BUNDLE_PATH: bundle}
    is_plain_file = system_bundle.is_file() and not os.path.islink(system_bundle)
    return files, (bundle if is_plain_file else None)
