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

from cairn.engine.runtime import Runtime
from tests.runtimes import scratch_runtime
from tests.unit.engine.harness import EngineHarness


@pytest.fixture
async def runtime() -> AsyncIterator[Runtime]:
    async with scratch_runtime("cairn-turn-") as built:
        yield built


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
