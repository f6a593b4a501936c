"""The proxy's door into a sandbox: a TCP listener on 127.0.0.1 inside its network namespace.

A sandbox with network has a namespace of its own with nothing but loopback, so nothing
in it reaches any other network. Its one way out is this listener: a socket created in
the sandbox's namespace (and so reachable only from there) but held and served by the
proxy on the host, which thereby knows the session of every connection it accepts. This
replaces the Unix socket and in-sandbox bridge process of other designs (Anthropic's
sandbox-runtime): no program runs in the sandbox for it, there is no socket file to bind
in, and no relay hop (docs/decisions.md, "Egress").

Creating a socket in another namespace takes `setns`, which a multi-threaded process (the
server) cannot do for a user namespace, and which needs the rights of that namespace's
owner: a short-lived single-threaded helper (the server's interpreter, isolated mode)
enters the sandbox's user and network namespaces through the init's pidfd (so a recycled
pid is never entered), makes and binds the socket, and hands it back over a socketpair.
"""

from __future__ import annotations

import socket
import subprocess
import sys

from cairn.errors import SandboxError

__all__ = ["PROXY_PORT", "listen_in_namespace"]

# Where sandboxed programs find the proxy: HTTP_PROXY=http://127.0.0.1:3128 and the like.
PROXY_PORT = 3128
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_HELPER = f"""
import ctypes, os, socket, sys
pidfd, channel, port = (int(arg) for arg in sys.argv[1:4])
libc = ctypes.CDLL(None, use_errno=True)
if libc.setns(pidfd, {_CLONE_NEWUSER | _CLONE_NEWNET}) != 0:
    error = ctypes.get_errno()
    sys.exit("setns: " + os.strerror(error))
listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.bind(("127.0.0.1", port))
listener.listen(512)
socket.send_fds(socket.socket(fileno=channel), [b"ok"], [listener.fileno()])
"""
_TIMEOUT_S = 30.0


def listen_in_namespace(init_pidfd: int, port: int = PROXY_PORT) -> socket.socket:
    """A listening socket on 127.0.0.1:`port` in the network namespace of the process
    whose pidfd is `init_pidfd` (blocking). Raises `SandboxError` if it cannot be made."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        try:
            result = subprocess.run(
                [sys.executable, "-I", "-S", "-c", _HELPER, str(init_pidfd), str(theirs.fileno()), str(port)],
                pass_fds=(init_pidfd, theirs.fileno()),
                capture_output=True,
                timeout=_TIMEOUT_S,
                env={},
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxError(f"could not open the egress proxy's door into the sandbox: {exc}") from exc
        if result.returncode != 0:
            reason = result.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {result.returncode}"]
            raise SandboxError(f"could not open the egress proxy's door into the sandbox: {reason[0]}")
        ours.settimeout(_TIMEOUT_S)
        _, fds, _, _ = socket.recv_fds(ours, 16, 1)
    if not fds:
        raise SandboxError("the egress helper handed back no listener")
    return socket.socket(fileno=fds[0])
