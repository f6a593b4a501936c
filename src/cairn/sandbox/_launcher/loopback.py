"""Brings up `lo` in the command's new network namespace, which starts with it down.

Without it, even the sandbox's own 127.0.0.1 is "Network is unreachable" (bwrap does the
same). `_socket` and an ioctl rather than `socket`: the public module imports `enum`,
which the launcher's start-up time cannot afford.
"""

from __future__ import annotations

import _socket
import fcntl
import struct

__all__ = ["bring_up_loopback"]

_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFF_RUNNING = 0x40


def bring_up_loopback() -> None:
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        request = struct.pack("16sH22x", b"lo", _IFF_UP | _IFF_LOOPBACK | _IFF_RUNNING)
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, request)
    finally:
        sock.close()
