"""Waiting until a workspace has left the stat cache's racy window, as real time makes it.

An entry changed less than `RACY_WINDOW_NS` before a scan starts is not vouched for (its
change may share a clock tick with the scan), so a test of the path that trusts a stat walk
waits until every entry of the tree passes the same rule, `stat_cache.settled`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from cairn.snapshots.stat_cache import settled

__all__ = ["is_settled"]


def _change_times(root: Path) -> Iterator[int]:
    yield os.lstat(root).st_ctime_ns
    for directory, subdirectories, files in os.walk(root):
        for name in subdirectories + files:
            yield os.lstat(os.path.join(directory, name)).st_ctime_ns


def is_settled(root: Path) -> bool:
    """Whether a scan of `root` starting now would trust every entry of it."""
    now = time.time_ns()
    return all(settled(ctime_ns, scan_started_ns=now) for ctime_ns in _change_times(root))
