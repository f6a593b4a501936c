from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    # Debug mode turns a blocking call on the event loop into a slow-callback warning (an error).
    return ("asyncio", {"debug": True})
