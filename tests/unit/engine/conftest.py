"""The engine's fixtures: `runtime`, a runtime built by the composition root on a real SQLite
database (default sandbox, scripted models); `engine`, a fresh data dir with a restartable
runtime on it and a fake sandbox (`harness.EngineHarness`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cairn.bootstrap import build_runtime
from cairn.config import Settings
from cairn.engine.runtime import Runtime
from cairn.store.db import Database
from cairn.store.migrate import upgrade
from tests.unit.engine.harness import EngineHarness


@pytest.fixture
async def runtime() -> AsyncIterator[Runtime]:
    # Under /tmp, not pytest's 0700 tree: the sandbox's account must reach the workspace.
    root = Path(tempfile.mkdtemp(prefix="cairn-turn-"))
    os.chmod(root, 0o711)
    scripts = root / "scripts"
    scripts.mkdir()
    settings = Settings(data_dir=root / "data", scripts_dir=scripts)
    settings.data_dir.mkdir()
    db = Database(settings.resolved_database_url)
    await upgrade(db)
    try:
        yield build_runtime(settings, db)
    finally:
        await db.dispose()
        shutil.rmtree(root)


@pytest.fixture
async def engine() -> AsyncIterator[EngineHarness]:
    # Under /tmp, not pytest's 0700 tree: a sandbox's account must reach the workspace.
    root = Path(tempfile.mkdtemp(prefix="cairn-engine-"))
    os.chmod(root, 0o711)
    harness = EngineHarness(root)
    await harness.open()
    try:
        yield harness
    finally:
        await harness.close()
        shutil.rmtree(root)
