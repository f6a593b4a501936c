"""A text progress bar for long snapshot operations in the CLI (restore, persist).

It is a `Progress` callback: called with (bytes done, bytes total) from worker threads, so it
locks, and it redraws at most ten times a second. On a stream that is not a terminal it only
prints the final line, so logs stay readable.
"""

from __future__ import annotations

import threading
import time
from typing import TextIO

__all__ = ["ProgressBar"]

_WIDTH = 30
_MIB = 1024 * 1024


class ProgressBar:
    def __init__(self, stream: TextIO, label: str) -> None:
        self._stream = stream
        self._label = label
        self._lock = threading.Lock()
        self._last_draw = 0.0
        self._done = 0
        self._total = 0
        self._is_tty = stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        with self._lock:
            self._done, self._total = done, total
            now = time.monotonic()
            if self._is_tty and now - self._last_draw >= 0.1:
                self._last_draw = now
                self._stream.write(f"\r{self.render()}")
                self._stream.flush()

    def render(self) -> str:
        fraction = self._done / self._total if self._total else 1.0
        filled = round(fraction * _WIDTH)
        return (
            f"{self._label} [{'#' * filled}{'.' * (_WIDTH - filled)}] {fraction:4.0%} "
            f"{self._done / _MIB:.1f}/{self._total / _MIB:.1f} MiB"
        )

    def finish(self) -> None:
        with self._lock:
            prefix = "\r" if self._is_tty else ""
            self._stream.write(f"{prefix}{self.render()}\n")
            self._stream.flush()
