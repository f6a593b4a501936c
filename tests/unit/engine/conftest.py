"""The engine's fixtures: `runtime`, a runtime built by the composition root on a real SQLite
database (default sandbox, scripted models); `executed`, the paths the file tools really
touched (the side effects of a turn). `engine` (`tests/unit/conftest.py`) is a fresh data
dir with a restartable runtime on it and a fake sandbox."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from cairn.engine.runtime import Runtime
from cairn.engine.tools import workspace as workspace_tools
from tests.runtimes import scratch_runtime


@pytest.fixture
async def runtime() -> AsyncIterator[Runtime]:
    async with scratch_runtime("cairn-turn-") as built:
        yield built


@pytest.fixture
def executed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths file tools really touched, in order."""
    touched: list[str] = []
    run = workspace_tools._run_parsed

    async def counting(parsed: Any, files: Any) -> str:
        touched.append(parsed.path)
        return await run(parsed, files)

    monkeypatch.setattr(workspace_tools, "_run_parsed", counting)
    return touched
