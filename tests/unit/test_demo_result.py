"""`DemoResult.failure`: the demo's one-line error names what actually went wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn.demo import DemoResult

_DONE = ("completed", "completed")


@pytest.mark.parametrize(
    ("statuses", "artifact", "problem", "failure"),
    [
        (_DONE, Path("tree.py"), "", ""),
        (("completed", "failed"), Path("tree.py"), "", "turns completed, failed"),
        (_DONE, None, "", "both turns completed, but no artifact was published"),
        (_DONE, Path("tree.py"), "--max-depth 1 shows level3", "the published tree.py does not work: --max-depth 1 shows level3"),
    ],
)
def test_failure_names_the_first_thing_that_went_wrong(
    statuses: tuple[str, ...], artifact: Path | None, problem: str, failure: str
) -> None:
    result = DemoResult("scripted:tutorial", statuses, artifact, (1.0, 1.0), problem)
    assert result.failure == failure
    assert result.succeeded is (failure == "")
