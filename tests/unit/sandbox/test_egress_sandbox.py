"""Egress from real bwrap sandboxes (both forms): with network on, a sandbox still reaches
nothing of the host or of private networks, reaches allowed destinations only through
Cairn's proxy, and has its credentials substituted on the wire by the proxy alone.

Every check is made where it counts: on the host's listeners and the local upstream's
record of what it received, not only on what the sandboxed program prints.
"""

from __future__ import annotations

import importlib.util
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.errors import SandboxError
from cairn.sandbox import ExecRequest, testing
from cairn.sandbox.bwrap import BwrapBackend
from cairn.sandbox.bwrap_sessions import SessionBwrapBackend, detect_bwrap
from cairn.sandbox.doctor import describe_host
from cairn.sandbox.egress import EgressCA, EgressProxy, EgressSettings, NetworkPolicy, SessionEgress, WireSecret
from cairn.sandbox.egress.addresses import host_addresses
from cairn.sandbox.egress.testing import LocalUpstream, local_upstream
from cairn.sandbox.testing import LoopbackListeners

pytestmark = pytest.mark.anyio

API = "api.test"
OTHER = "other.test"
NAMES = (API, OTHER, "www.allowed.test", "blocked.allowed.test")
SECRET = "sk-real-secret-9d8c7b6a5f4e3d2c1b0a"
PLACEHOLDER = "cairn_ph_0a1b2c3d4e5f60718293a4b5c6d7e8f9"


@pytest.fixture(scope="module")
def tls_upstream() -> Iterator[LocalUpstream]:
    with local_upstream(*NAMES) as upstream:
        yield upstream


@pytest.fixture(scope="module")
def plain_upstream() -> Iterator[LocalUpstream]:
    with local_upstream(*NAMES, tls=False) as upstream:
        yield upstream


@pytest.fixture(scope="module", params=["session containers", "per command"])
def backend(request: pytest.FixtureRequest, tls_upstream: LocalUpstream) -> Iterator[BwrapBackend]:
    """bwrap in both forms: the proxy's door opens when a session container starts, or for
    each command of the per-command form."""
    try:
        backend = detect_bwrap(session_containers=request.param == "session containers")
    except SandboxError as exc:
        pytest.skip(f"bwrap ({request.param}) does not work here: {exc.message}")
    assert isinstance(backend, SessionBwrapBackend) == (request.param == "session containers")
    settings = EgressSettings(
        allow_private=frozenset(NAMES),
        hosts={**{name: "127.0.0.1" for name in NAMES}, "evil.test": "127.0.0.1"},
        upstream_ca=tls_upstream.ca_file,
        intercept_ports=(443, 8443, tls_upstream.port),
    )
    backend.use_egress(EgressProxy(settings, EgressCA.ephemeral()))
    yield backend
    backend.egress.close()


@pytest.fixture(scope="module")
def workspace_root() -> Iterator[Path]:
    with testing.workspace_root("cairn-egress-tests-") as root:
        yield root


async def run(
    backend: BwrapBackend, workspace: Path, command: str, egress: SessionEgress | None,
    env: dict[str, str] | None = None,
) -> str:
    chunks: list[bytes] = []

    async def collect(chunk: bytes) -> None:
        chunks.append(chunk)

    request = ExecRequest(command=command, workspace=workspace, timeout_s=60, egress=egress, env=env or {})
    await backend.exec(request, collect)
    return b"".join(chunks).decode(errors="replace")


def status_of(url: str, *extra: str) -> str:
    """A curl command printing `<url> <status>` (000 when no HTTP answer came)."""
    return f"echo {url} $(curl -s -m 10 -o /dev/null -w '%{{http_code}}' {' '.join(extra)} {url})"


def statuses(output: str) -> dict[str, str]:
    return dict(line.rsplit(" ", 1) for line in output.splitlines() if line.count(" ") >= 1)


def enabled(session_id: str, *secrets: WireSecret) -> SessionEgress:
    return SessionEgress(session_id, NetworkPolicy("enabled"), secrets)


async def test_with_network_the_host_and_private_ranges_stay_out_of_reach(
    backend: BwrapBackend, workspace_root: Path, plain_upstream: LocalUpstream
) -> None:
    workspace = await testing.new_workspace(workspace_root, backend)
    own = sorted(str(a) for a in host_addresses() if a.version == 4 and not a.is_loopback)
    with LoopbackListeners() as listeners:
        port = listeners.tcp_port
        targets = [f"http://127.0.0.1:{port}/", f"http://localhost.:{port}/", "http://169.254.169.254/",
                   "http://10.1.2.3/", "http://192.168.1.1/", f"http://evil.test:{port}/",
                   *(f"http://{address}:{port}/" for address in own)]
        # NO_PROXY keeps loopback names off the proxy (they are the sandbox's own loopback,
        # tried directly below); here every target goes to the proxy.
        script = "\n".join(status_of(url, "--noproxy ''") for url in targets)
        through_proxy = statuses(await run(backend, workspace, script, enabled("sess_egress_host")))
        ignoring_proxy = statuses(await run(
            backend, workspace, "\n".join(status_of(url, "--noproxy '*'") for url in targets),
            enabled("sess_egress_host"),
        ))
        assert not listeners.received_anything()
    assert through_proxy == {url: "403" for url in targets}
    assert ignoring_proxy == {url: "000" for url in targets}
    # The control: an allowed upstream is reached through the same proxy.
    control = statuses(await run(backend, workspace, status_of(f"http://{API}:{plain_upstream.port}/"),
                                 enabled("sess_egress_host")))
    assert control == {f"http://{API}:{plain_upstream.port}/": "200"}


async def test_a_program_that_ignores_the_proxy_reaches_nothing(
    backend: BwrapBackend, workspace_root: Path, plain_upstream: LocalUpstream
) -> None:
    workspace = await testing.new_workspace(workspace_root, backend)
    before = len(plain_upstream.received)
    own = [str(a) for a in host_addresses() if a.version == 4 and not a.is_loopback]
    probe = textwrap.dedent(f"""
        import socket
        for host in {["127.0.0.1", "1.1.1.1", "8.8.8.8", *own]!r}:
            try:
                socket.create_connection((host, {plain_upstream.port}), timeout=3)
                print("TCP-OK", host)
            except OSError as error:
                print("tcp", host, error)
        try:
            socket.getaddrinfo("example.com", 80)
            print("DNS-OK")
        except OSError as error:
            print("dns", error)
    """)
    (workspace / "probe.py").write_text(probe)
    output = await run(backend, workspace, "python3 probe.py; ip -o link | cut -d: -f2", enabled("sess_egress_raw"))
    assert "TCP-OK" not in output and "DNS-OK" not in output
    assert output.strip().endswith("lo")  # the namespace has loopback and nothing else
    assert len(plain_upstream.received) == before


async def test_restricted_allows_exactly_its_domains_minus_the_blocked(
    backend: BwrapBackend, workspace_root: Path, plain_upstream: LocalUpstream
) -> None:
    workspace = await testing.new_workspace(workspace_root, backend)
    policy = NetworkPolicy("restricted", allowed_domains=(API, "*.allowed.test"), blocked_domains=("blocked.allowed.test",))
    urls = {host: f"http://{host}:{plain_upstream.port}/" for host in NAMES}
    output = await run(backend, workspace, "\n".join(status_of(url) for url in urls.values()),
                       SessionEgress("sess_egress_restricted", policy))
    assert statuses(output) == {
        urls[API]: "200", urls["www.allowed.test"]: "200", urls["blocked.allowed.test"]: "403", urls[OTHER]: "403",
    }


async def test_credentials_are_substituted_only_for_their_hosts(
    backend: BwrapBackend, workspace_root: Path, tls_upstream: LocalUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    workspace = await testing.new_workspace(workspace_root, backend)
    shutil.copy(tls_upstream.ca_file, workspace / "upstream-ca.pem")
    port = tls_upstream.port
    secret = WireSecret("cred_api", "API_KEY", PLACEHOLDER, SECRET, (API,))
    (workspace / "client.py").write_text(textwrap.dedent(f"""
        import os, ssl, sys, urllib.request
        host, cafile = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
        request = urllib.request.Request(
            f"https://{{host}}:{port}/urllib-{{host}}", data=("key=" + os.environ["API_KEY"]).encode(),
            headers={{"Authorization": "Bearer " + os.environ["API_KEY"]}},
        )
        context = ssl.create_default_context(cafile=cafile)
        print(urllib.request.urlopen(request, context=context).status)
    """))
    script = (
        f'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" -d "key=$API_KEY" https://{API}:{port}/curl\n'
        f"python3 client.py {API}\n"
        # The same requests to a host the credential is not allowed for: tunnelled as they are.
        f'curl -sS -m 10 --cacert upstream-ca.pem -H "Authorization: Bearer $API_KEY" https://{OTHER}:{port}/curl-other\n'
        f"python3 client.py {OTHER} upstream-ca.pem\n"
    )
    output = await run(backend, workspace, script, enabled("sess_egress_secrets", secret), env={"API_KEY": PLACEHOLDER})
    assert output.split() == ["ok", "200", "ok", "200"]
    received = {request.path: request for request in tls_upstream.received}
    for path in ("/curl", f"/urllib-{API}"):
        assert received[path].headers["Authorization"] == f"Bearer {SECRET}"
        assert received[path].body == f"key={SECRET}".encode()
    assert received["/curl-other"].headers["Authorization"] == f"Bearer {PLACEHOLDER}"
    other = received[f"/urllib-{OTHER}"]
    assert other.headers["Authorization"] == f"Bearer {PLACEHOLDER}" and other.body == f"key={PLACEHOLDER}".encode()
    # requests as a sandboxed program gets it: its own copy in the workspace (the rootfs is the
    # host's /usr, which need not have it), trusting what the sandbox's REQUESTS_CA_BUNDLE names.
    for package in ("requests", "urllib3", "idna", "certifi", "charset_normalizer"):
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, f"{package} is a test dependency"
        shutil.copytree(spec.submodule_search_locations[0], workspace / "site" / package)
    requests_call = (f"PYTHONPATH=/workspace/site python3 -c \"import os, requests; print(requests.post("
                     f"'https://{API}:{port}/requests', headers={{'Authorization': 'Bearer ' + os.environ['API_KEY']}})"
                     ".status_code)\"")
    assert (await run(backend, workspace, requests_call, enabled("sess_egress_secrets", secret),
                      env={"API_KEY": PLACEHOLDER})).strip() == "200"
    assert [r for r in tls_upstream.received if r.path == "/requests"][0].headers["Authorization"] == f"Bearer {SECRET}"
    # What the sandbox can see of the secret: nothing, not even in its own files.
    leaked = await run(backend, workspace, f"env; grep -rs {SECRET} /workspace /tmp /etc; echo done",
                       enabled("sess_egress_secrets", secret), env={"API_KEY": PLACEHOLDER})
    assert SECRET not in leaked and leaked.endswith("done\n")
    assert SECRET not in caplog.text


async def test_an_echo_from_an_intercepted_host_shows_the_sandbox_only_the_placeholder(
    backend: BwrapBackend, workspace_root: Path, tls_upstream: LocalUpstream
) -> None:
    workspace = await testing.new_workspace(workspace_root, backend)
    secret = WireSecret("cred_api", "API_KEY", PLACEHOLDER, SECRET, (API,))
    before = len(tls_upstream.received)
    # The service reflects the header (in its own header, its body and a chunked body's
    # trailer) and the body it got, which held the real secret on the wire; curl asks for
    # compression, which the proxy replaces by identity so that the answer can be read.
    script = (f'curl -sS -m 10 --compressed -D - -H "Authorization: Bearer $API_KEY" -d "key=$API_KEY" '
              f'"https://{API}:{tls_upstream.port}/echo-sandbox?chunked=9" > echo.txt; cat echo.txt; '
              f"grep -c {SECRET} echo.txt")
    output = await run(backend, workspace, script, enabled("sess_egress_echo", secret), env={"API_KEY": PLACEHOLDER})
    [wire] = tls_upstream.received[before:]
    assert wire.headers["Authorization"] == f"Bearer {SECRET}" and wire.body == f"key={SECRET}".encode()
    assert wire.headers["Accept-Encoding"] == "identity"
    assert SECRET not in output and output.endswith("\n0\n")  # grep found nothing in what curl saved
    assert f"X-Echo-Authorization: Bearer {PLACEHOLDER}" in output
    assert f"Authorization: Bearer {PLACEHOLDER}\n" in output and f"key={PLACEHOLDER}" in output


def test_doctor_reports_the_egress_mode() -> None:
    report = describe_host("bwrap", EgressSettings(allow_private=frozenset({"registry.corp"}), max_connections=9))
    assert "egress mode: proxy" in report
    assert "private hosts allowed by the operator: registry.corp" in report and "9 connections" in report
