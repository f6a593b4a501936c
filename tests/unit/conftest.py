"""Fixtures of the unit tests that run the engine: `engine`, a fresh data dir with a
restartable runtime on it and a fake sandbox (`tests.unit.engine.harness.EngineHarness`),
for the engine's tests and the API's in-process ones."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.unit.engine.harness import EngineHarness


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
