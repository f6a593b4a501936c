"""Host-side checks for sandbox tests: what is still running on the host after a command.

Escape and cleanup tests assert on the host, not on what a sandboxed command reports, so
backend-level and end-to-end suites share this one scan of the host's /proc.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["host_processes_with"]


def host_processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker`, the calling process excluded."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the process exited while we looked: it is not running
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found
