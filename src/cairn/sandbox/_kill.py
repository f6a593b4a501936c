"""SIGKILL a process or a process group that may already be gone.

Killing is how every backend ends a command's tree; finding the target already exited is
the goal reached, so it is reported as a boolean rather than as an error.
"""

from __future__ import annotations

import os
import signal

__all__ = ["sigkill", "sigkill_group"]


def sigkill(pid: int) -> bool:
    """Send SIGKILL to `pid`; return False when no such process exists any more."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def sigkill_group(pgid: int) -> bool:
    """Send SIGKILL to process group `pgid`; return False when the group is empty."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True
