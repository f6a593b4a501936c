"""A runtime on a fresh data dir with a real SQLite database, for tests that run the engine in-process."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from cairn.bootstrap import build_runtime
from cairn.config import Settings
from cairn.engine.runtime import Runtime
from cairn.store.db import Database
from cairn.store.migrate import upgrade

__all__ = ["scratch_runtime"]


@asynccontextmanager
async def scratch_runtime(prefix: str, **settings: Any) -> AsyncIterator[Runtime]:
    """A runtime whose data dir (with an empty `scripts_dir` beside it) goes when the block ends."""
    # Under /tmp, not pytest's 0700 tree: the sandbox's account must reach the workspace.
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o711)
    scripts = root / "scripts"
    scripts.mkdir()
    config = Settings(data_dir=root / "data", scripts_dir=scripts, **settings)
    config.data_dir.mkdir()
    db = Database(config.resolved_database_url)
    await upgrade(db)
    try:
        yield build_runtime(config, db)
    finally:
        await db.dispose()
        shutil.rmtree(root)
