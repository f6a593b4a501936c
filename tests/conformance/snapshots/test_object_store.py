"""The `ObjectStore` contract, for every transport."""

from __future__ import annotations

import pytest

from cairn.snapshots import ObjectMissingError, ObjectStore


@pytest.mark.parametrize("announced", [False, True], ids=["no-size-hint", "size-hint"])
def test_committed_object_reads_back_whole_and_by_range(objects: ObjectStore, announced: bool) -> None:
    data = bytes(range(256)) * 50_000  # 12.8 MB: several multipart parts on S3
    # A size hint may change how a transport writes (the local one goes around the page cache),
    # never what it stores.
    with objects.open_writer("a/b/blob", size_hint=len(data) if announced else None) as writer:
        for start in range(0, len(data), 1_000_000):
            writer.write(data[start : start + 1_000_000])
        writer.commit()
    assert objects.get_bytes("a/b/blob") == data
    for offset, length in [(1_000, 5_000), (4096, 9_000_001), (333, len(data) - 333)]:
        reader = objects.open_reader("a/b/blob", offset, length)
        try:
            assert reader.read() == data[offset : offset + length]
        finally:
            reader.close()
    assert [(info.key, info.size) for info in objects.list("a/")] == [("a/b/blob", len(data))]


def test_uncommitted_and_aborted_writes_are_invisible(objects: ObjectStore) -> None:
    writer = objects.open_writer("x/pending")
    writer.write(b"x" * (6 * 1024 * 1024))
    assert list(objects.list("x/")) == []
    writer.abort()
    with objects.open_writer("x/failed") as failing:
        failing.write(b"partial")
    assert list(objects.list("x/")) == []
    with pytest.raises(ObjectMissingError):
        objects.get_bytes("x/pending")


def test_a_failure_inside_the_writer_block_leaves_nothing(objects: ObjectStore) -> None:
    with pytest.raises(RuntimeError), objects.open_writer("y/boom") as writer:
        writer.write(b"data")
        raise RuntimeError("boom")
    assert list(objects.list("y/")) == []


def test_delete_is_idempotent_and_list_is_prefix_scoped(objects: ObjectStore) -> None:
    objects.put_bytes("p/one", b"1")
    objects.put_bytes("q/two", b"2")
    objects.delete("p/one")
    objects.delete("p/one")
    assert list(objects.list("p/")) == []
    assert [info.key for info in objects.list("q/")] == ["q/two"]


def test_empty_range_and_empty_object(objects: ObjectStore) -> None:
    objects.put_bytes("e/empty", b"")
    assert objects.get_bytes("e/empty") == b""
    reader = objects.open_reader("e/empty", 0, 0)
    try:
        assert reader.read() == b""
    finally:
        reader.close()
