"""Private per-process directories under $TMPDIR, and removal of those of dead servers.

Backends keep a few host directories for their whole life (bwrap's generated /etc files,
the mount point of the namespaces backend's root, the landlock backend's scratch root).
Each is fresh (`mkdtemp`: never a predictable path someone else could plant) and carries
the server's pid in its name, so that a later server removes those a killed server could
not (the same rule as for cgroup leaves: a directory whose pid is alive is left alone).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import weakref
from pathlib import Path

__all__ = ["private_dir"]

logger = logging.getLogger(__name__)


def private_dir(kind: str, owner: object, *, mode: int = 0o700) -> Path:
    """A new directory `cairn-<kind>-<pid>-*`, removed when `owner` is garbage-collected."""
    root = Path(tempfile.gettempdir())
    _remove_stale(root, kind)
    path = Path(tempfile.mkdtemp(prefix=f"cairn-{kind}-{os.getpid()}-", dir=root))
    path.chmod(mode)
    weakref.finalize(owner, shutil.rmtree, path)
    return path


def _remove_stale(root: Path, kind: str) -> None:
    for path in root.glob(f"cairn-{kind}-*-*"):
        pid = path.name[len(f"cairn-{kind}-") :].split("-", 1)[0]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        try:
            info = path.lstat()
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
                shutil.rmtree(path)
        except OSError as exc:
            logger.warning("could not remove stale sandbox directory %s: %s", path, exc)
