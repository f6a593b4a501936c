from __future__ import annotations

import pytest

from cairn.snapshots import InvalidSnapshotIdError, parse_snapshot_id
from cairn.snapshots.ids import new_snapshot_id


@pytest.mark.parametrize("value", ["", ".", "..", "a/b", "/abs", "a\\b", "nul\0", "sp ace", "x" * 129, "é"])
def test_rejects_anything_but_a_single_safe_segment(value: str) -> None:
    with pytest.raises(InvalidSnapshotIdError) as caught:
        parse_snapshot_id(value)
    assert caught.value.http_status == 400


def test_generated_ids_are_valid_and_sort_by_creation() -> None:
    ids = [new_snapshot_id() for _ in range(50)]
    assert [parse_snapshot_id(value) for value in ids] == ids
    assert sorted(ids) == ids
