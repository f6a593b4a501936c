"""The test waits: they return what they waited for, and fail saying what when it never comes."""

from __future__ import annotations

import pytest

from tests.waits import until, until_blocking

pytestmark = pytest.mark.anyio


async def test_until_returns_the_first_truthy_value_of_a_function_or_a_coroutine_function() -> None:
    values = iter([0, None, 3])
    assert await until(lambda: next(values), "a value") == 3

    async def ready() -> str:
        return "ready"

    assert await until(ready, "readiness") == "ready"


async def test_until_fails_at_its_deadline_saying_what_it_waited_for_and_saw() -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for the door to open; last saw 'shut'"):
        await until(lambda: False, "the door to open", timeout_s=0.05, seen=lambda: "shut")


def test_until_blocking_returns_or_fails_alike() -> None:
    values = iter([False, "open"])
    assert until_blocking(lambda: next(values), "the door to open") == "open"
    with pytest.raises(AssertionError, match="timed out after 0.05 s waiting for the door to open$"):
        until_blocking(lambda: False, "the door to open", timeout_s=0.05)
