"""The egress proxy (issue 18): what it adds to an HTTPS request, and what it keeps of a
download's throughput.

Not part of the test run. One run, three ways to the same local HTTPS upstream (its own
process, its own test CA), interleaved request by request:

- `direct`: curl straight to the upstream;
- `tunnel`: curl through the proxy (CONNECT) to a host without credentials: TLS end to end;
- `intercepted`: curl through the proxy to a host with a credential: the proxy terminates
  TLS with Cairn's CA, re-encrypts to the upstream and substitutes the placeholder in the
  request's Authorization header;
- `forwarder` (the reference for the hop itself): curl to a bare TCP forwarder in this process
  (`--connect-to`), two threads per connection doing blocking `recv`/`sendall` with Nagle
  off: what the second hop costs with nothing to decide.

Each request is a fresh curl (a new connection and TLS handshake, as a sandboxed command
makes), timed by curl itself (`time_total`, so process start is not counted). The proxy
runs in this process on its own thread, as in a worker, behind a listener on the host's
loopback (in a sandbox the same listener sits in the sandbox's namespace). Printed: the
median and p90 of each way and the medians' differences; then the throughput of a 100 MiB
download, direct and through the tunnel (and intercepted, for information), medians of
`--downloads` runs, with the CPU time each download cost curl and the proxy (this
process, whose other thread only waits for curl). On a loopback the download is bound by
CPU alone, so the proxy's CPU is what a second hop costs; over a real link it is what
remains of the cost. Targets: under 2 ms added per tunnelled request, under 5 ms per
intercepted one, at least 80 % of direct throughput through the tunnel.

Usage: .venv/bin/python benchmarks/egress.py [--requests 200] [--downloads 5] [--mib 100]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from cairn.sandbox.egress import EgressCA, EgressProxy, EgressSettings, NetworkPolicy, SessionEgress, WireSecret

TUNNEL_HOST = "plain.bench.test"
INTERCEPTED_HOST = "api.bench.test"
PLACEHOLDER = "cairn_bench_placeholder_0123456789abcdef"
_UPSTREAM = """
import sys
from pathlib import Path
from cairn.sandbox.egress.testing import local_upstream
with local_upstream(*sys.argv[1:]) as upstream:
    print(upstream.port, upstream.ca_file, flush=True)
    sys.stdin.read()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--downloads", type=int, default=5)
    parser.add_argument("--mib", type=int, default=100)
    args = parser.parse_args()
    if shutil.which("curl") is None:
        sys.exit("benchmarks/egress.py needs curl")
    upstream = subprocess.Popen(
        [sys.executable, "-c", _UPSTREAM, TUNNEL_HOST, INTERCEPTED_HOST],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert upstream.stdout is not None and upstream.stdin is not None
    port_text, ca_file = upstream.stdout.readline().split()
    port = int(port_text)
    proxy = EgressProxy(
        EgressSettings(
            allow_private=frozenset({TUNNEL_HOST, INTERCEPTED_HOST}),
            hosts={TUNNEL_HOST: "127.0.0.1", INTERCEPTED_HOST: "127.0.0.1"},
            upstream_ca=Path(ca_file),
            intercept_ports=(port,),
        ),
        EgressCA.ephemeral(),
    )
    secret = WireSecret("cred_bench", "API_KEY", PLACEHOLDER, "the-real-secret", (INTERCEPTED_HOST,))
    proxy.admit(SessionEgress("sess_bench", NetworkPolicy("enabled"), (secret,)))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    proxy_url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    close = proxy.serve(listener, "sess_bench")
    with tempfile.TemporaryDirectory(prefix="cairn-egress-bench-") as scratch:
        bundle = Path(scratch) / "bundle.pem"
        bundle.write_bytes(Path(ca_file).read_bytes() + proxy.ca.certificate_pem)
        ways = {
            "direct": ["--resolve", f"{TUNNEL_HOST}:{port}:127.0.0.1", f"https://{TUNNEL_HOST}:{port}/"],
            "tunnel": ["-x", proxy_url, f"https://{TUNNEL_HOST}:{port}/"],
            "intercepted": ["-x", proxy_url, f"https://{INTERCEPTED_HOST}:{port}/"],
            "forwarder": ["--connect-to", f"{TUNNEL_HOST}:{port}:127.0.0.1:{_forwarder(port)}",
                          f"https://{TUNNEL_HOST}:{port}/"],
        }
        try:
            _latency(ways, bundle, args.requests)
            size = args.mib * 1024 * 1024
            downloads = {name: [*argv[:-1], f"{argv[-1]}bytes/{size}"] for name, argv in ways.items()}
            _throughput(downloads, bundle, args.downloads, args.mib)
        finally:
            close()
            proxy.close()
            upstream.stdin.close()
            upstream.wait(timeout=30)


def _forwarder(port: int) -> int:
    """A bare TCP forwarder to 127.0.0.1:`port` on daemon threads; its own port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def copy(source: socket.socket, sink: socket.socket) -> None:
        buffer = memoryview(bytearray(256 * 1024))
        with contextlib.suppress(OSError):
            while size := source.recv_into(buffer):
                sink.sendall(buffer[:size])
            sink.shutdown(socket.SHUT_WR)

    def forward(client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", port)) as upstream:
            for sock in (client, upstream):  # as the proxy does: no Nagle delay on small writes
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upward = threading.Thread(target=copy, args=(client, upstream), daemon=True)
            upward.start()
            copy(upstream, client)
            upward.join()

    def accept() -> None:
        while True:
            client, _ = listener.accept()
            threading.Thread(target=forward, args=(client,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return int(listener.getsockname()[1])


def _curl(argv: list[str], bundle: Path, metric: str) -> tuple[float, float, float]:
    """curl's `metric`, and the CPU seconds the request cost curl and this process (the proxy)."""
    before = _cpu(resource.getrusage(resource.RUSAGE_SELF))
    curl = subprocess.Popen(
        ["curl", "-sS", "--fail", "--http1.1", "--cacert", str(bundle), "-o", "/dev/null", "-w", f"%{{{metric}}}",
         "-H", f"Authorization: Bearer {PLACEHOLDER}", *argv],
        stdout=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"},
    )
    assert curl.stdout is not None
    output = curl.stdout.read()
    _, status, usage = os.wait4(curl.pid, 0)
    curl.returncode = os.waitstatus_to_exitcode(status)
    if curl.returncode != 0:
        sys.exit(f"curl {' '.join(argv)} failed with exit code {curl.returncode}")
    return float(output), _cpu(usage), _cpu(resource.getrusage(resource.RUSAGE_SELF)) - before


def _cpu(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def _latency(ways: dict[str, list[str]], bundle: Path, requests: int) -> None:
    times: dict[str, list[float]] = {name: [] for name in ways}
    for argv in ways.values():  # warm up: leaf certificate, connection paths
        _curl(argv, bundle, "time_total")
    for _ in range(requests):
        for name, argv in ways.items():
            times[name].append(_curl(argv, bundle, "time_total")[0] * 1000)
    print(f"HTTPS request, new connection each ({requests} each, interleaved), ms:")
    direct = statistics.median(times["direct"])
    for name, values in times.items():
        median = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        added = "" if name == "direct" else f"   added {median - direct:+.2f} ms"
        print(f"  {name:<12} p50 {median:7.2f}  p90 {p90:7.2f}{added}")


def _throughput(ways: dict[str, list[str]], bundle: Path, downloads: int, mib: int) -> None:
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
    for _ in range(downloads):
        for name, argv in ways.items():
            runs[name].append(_curl(argv, bundle, "speed_download"))
    print(f"{mib} MiB download ({downloads} each, interleaved), MB/s and CPU ms per download:")
    direct = statistics.median(speed for speed, _, _ in runs["direct"])
    for name, values in runs.items():
        speed = statistics.median(speed for speed, _, _ in values) / 1e6
        curl_ms = 1000 * statistics.median(curl for _, curl, _ in values)
        proxy_ms = 1000 * statistics.median(proxy for _, _, proxy in values)
        print(f"  {name:<12} p50 {speed:8.1f}   {100 * speed * 1e6 / direct:5.1f} % of direct"
              f"   curl {curl_ms:4.0f} ms   proxy {proxy_ms:4.0f} ms")


if __name__ == "__main__":
    main()
