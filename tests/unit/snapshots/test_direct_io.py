"""Large objects of the local store go around the page cache (`_direct_io`), and still round-trip exactly.

Whether a page is cached is asked of the kernel itself (mincore), so a test can tell a direct
write or read from a buffered one.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import mmap
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from cairn.snapshots import (
    ContentAddressedSnapshotStore,
    LocalObjectStore,
    PersistRequest,
    SnapshotScope,
    _direct_io,
    local_objects,
)
from cairn.snapshots import persist as persist_module
from cairn.snapshots._direct_io import ALIGNMENT, aligned_buffer, is_aligned
from cairn.snapshots.errors import SnapshotStoreUnavailableError

MIB = 1024 * 1024
LARGE = local_objects.DIRECT_IO_MIN
SCOPE = SnapshotScope("tenant", "session")


def _supports_direct_io(directory: Path) -> bool:
    probe = directory / "probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    probe.unlink()
    return True


@pytest.fixture
def objects(tmp_path: Path) -> Iterator[LocalObjectStore]:
    if not _supports_direct_io(tmp_path):
        pytest.skip(f"the file system of {tmp_path} has no direct I/O")
    yield LocalObjectStore(tmp_path / "store")


def _is_cached(path: Path, offset: int) -> bool:
    """Whether the page of `path` at `offset` is in the page cache (mincore(2) on a mapping,
    which, unlike a read, brings nothing in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = mmap.PAGESIZE
    # A copy-on-write mapping, so ctypes can take its address; nothing is written to it.
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), page, access=mmap.ACCESS_COPY, offset=offset) as mapped:
        anchor = ctypes.c_char.from_buffer(mapped)
        residency = ctypes.create_string_buffer(1)
        status = libc.mincore(ctypes.addressof(anchor), page, residency)
        del anchor  # the mapping cannot close while ctypes holds it
        assert status == 0, os.strerror(ctypes.get_errno())
        return bool(residency.raw[0] & 1)


def _write(objects: LocalObjectStore, key: str, chunks: Iterable[bytes | memoryview], size_hint: int | None) -> None:
    with objects.open_writer(key, size_hint=size_hint) as writer:
        for chunk in chunks:
            writer.write(chunk)
        writer.commit()


def _aligned_chunks(data: bytes, chunk: int) -> Iterator[memoryview]:
    """`data` as views of one reused aligned buffer, the way a persist lane hands them over."""
    buffer = aligned_buffer(chunk)
    view = memoryview(buffer)
    for start in range(0, len(data), chunk):
        part = data[start : start + chunk]
        view[: len(part)] = part
        yield view[: len(part)]


@pytest.mark.parametrize("tail", [0, 1, ALIGNMENT - 1, ALIGNMENT, ALIGNMENT + 1, 300_001])
def test_aligned_chunks_are_written_around_the_page_cache_whatever_the_tail(
    objects: LocalObjectStore, tail: int
) -> None:
    data = os.urandom(LARGE + tail)
    with objects.open_writer("packs/big", size_hint=len(data)) as writer:
        for chunk in _aligned_chunks(data, MIB):
            writer.write(chunk)
        writer.write(b"index and footer")
        writer.commit()
    path = objects.root / "packs" / "big"
    assert not _is_cached(path, MIB), "a direct write left the pack in the page cache"
    assert path.read_bytes() == data + b"index and footer"
    assert not any(name.startswith(".") for name in os.listdir(path.parent))  # no temporary left


def test_objects_without_a_large_size_hint_use_the_page_cache(objects: LocalObjectStore) -> None:
    # The control for the test above: the same check sees a buffered write's pages.
    data = os.urandom(LARGE)
    _write(objects, "packs/small-hint", [data], size_hint=None)
    assert _is_cached(objects.root / "packs" / "small-hint", MIB)


def test_unaligned_and_read_only_chunks_are_gathered_first(objects: LocalObjectStore) -> None:
    data = os.urandom(LARGE + 12_345)
    sizes = [1, 4095, 4097, 65_536, 300_000, MIB + 7]
    chunks: list[bytes | memoryview] = []
    position = 0
    while position < len(data):
        size = sizes[len(chunks) % len(sizes)]
        piece = data[position : position + size]
        # bytes (read-only) and unaligned views of a bytearray alike
        chunks.append(piece if len(chunks) % 2 else memoryview(bytearray(b"x" + piece))[1:])
        position += size
    _write(objects, "packs/odd", chunks, size_hint=len(data))
    assert objects.get_bytes("packs/odd") == data


def _refuse_direct_open(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """As a file system without O_DIRECT (tmpfs before Linux 6.6, some FUSE ones): EINVAL at open."""
    real_open, refused = os.open, []

    def refusing_open(path: str, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_DIRECT:
            refused.append(flags)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(_direct_io.os, "open", refusing_open)
    return refused


def _refuse_first_direct_write(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """As a device whose logical blocks are larger than ALIGNMENT: EINVAL on a direct write."""
    real_pwrite, refused = os.pwrite, []

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        if not refused and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(local_objects.os, "pwrite", pwrite)
    return refused


@pytest.mark.parametrize(
    ("refuse", "warning"),
    [(_refuse_direct_open, "refuses direct I/O"), (_refuse_first_direct_write, "direct I/O refused")],
    ids=["at-open", "on-a-write"],
)
def test_where_direct_io_is_refused_the_page_cache_is_used_with_a_warning(
    objects: LocalObjectStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    refuse: Callable[[pytest.MonkeyPatch], list[int]],
    warning: str,
) -> None:
    refused = refuse(monkeypatch)
    data = os.urandom(LARGE + 5)
    with caplog.at_level(logging.WARNING):
        _write(objects, "packs/refused", _aligned_chunks(data, MIB), size_hint=len(data))
    assert len(refused) == 1
    assert objects.get_bytes("packs/refused") == data
    assert warning in caplog.text


def test_an_aborted_direct_writer_leaves_nothing(objects: LocalObjectStore) -> None:
    writer = objects.open_writer("packs/aborted", size_hint=LARGE)
    for chunk in _aligned_chunks(os.urandom(LARGE + 10), MIB):
        writer.write(chunk)
    writer.abort()
    assert list(objects.list("packs/")) == []
    assert os.listdir(objects.root / "packs") == []


@pytest.mark.parametrize("length_extra", [0, 123])
def test_long_ranges_are_read_without_staying_in_the_page_cache(objects: LocalObjectStore, length_extra: int) -> None:
    data = os.urandom(LARGE + MIB + 999)
    _write(objects, "packs/read", [data], size_hint=len(data))
    offset, length = ALIGNMENT, LARGE + length_extra
    assert not _is_cached(objects.root / "packs" / "read", 2 * MIB)
    reader = objects.open_reader("packs/read", offset, length)
    buffer = memoryview(bytearray(MIB))
    received = bytearray()
    try:
        while len(received) < length:
            view = buffer[: min(MIB, length - len(received))]  # the exact tail, as a restore asks
            count = reader.readinto(view)  # type: ignore[attr-defined]
            assert count > 0
            received += view[:count]
        assert reader.readinto(buffer) == 0  # type: ignore[attr-defined]
    finally:
        reader.close()
    assert bytes(received) == data[offset : offset + length]
    assert not _is_cached(objects.root / "packs" / "read", 2 * MIB), "a long range stayed in the page cache"


def test_a_long_range_still_serves_unaligned_requests(objects: LocalObjectStore) -> None:
    data = os.urandom(LARGE + 50_000)
    _write(objects, "packs/mixed", [data], size_hint=len(data))
    reader = objects.open_reader("packs/mixed", 0, len(data))
    try:
        first = memoryview(aligned_buffer(MIB))
        assert reader.readinto(first) == MIB  # type: ignore[attr-defined]
        unaligned = memoryview(bytearray(MIB + 1))[1:]
        assert reader.readinto(unaligned) == MIB  # type: ignore[attr-defined]
        rest = reader.read()
    finally:
        reader.close()
    assert bytes(first) + bytes(unaligned) + rest == data


def test_is_aligned_tells_aligned_views_from_others() -> None:
    buffer = memoryview(aligned_buffer(2 * ALIGNMENT))
    assert is_aligned(buffer) and is_aligned(buffer[ALIGNMENT:])
    assert not is_aligned(buffer[1:])
    assert not is_aligned(memoryview(bytes(ALIGNMENT)))  # read-only: never handed to the kernel directly


@pytest.mark.anyio
async def test_a_persisted_large_file_leaves_its_pack_out_of_the_page_cache_and_restores(
    objects: LocalObjectStore, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    large = os.urandom(persist_module.SMALL_FILE_LIMIT + 3 * MIB + 17)
    (workspace / "large.bin").write_bytes(large)
    (workspace / "small.txt").write_bytes(b"small")
    store = ContentAddressedSnapshotStore(objects, max_workers=2)
    try:
        await store.persist(PersistRequest(scope=SCOPE, workspace=workspace, manifest_digest="m"))
        (pack,) = [path for path in (objects.root / "tenants").rglob("*.pack") if path.stat().st_size > len(large)]
        assert not _is_cached(pack, MIB)
        target = tmp_path / "restored" / "ws"
        await store.restore(SCOPE, target)
    finally:
        await store.aclose()
    assert (target / "large.bin").read_bytes() == large
    assert not _is_cached(pack, MIB), "the restore left the pack in the page cache"


def test_a_negative_offset_is_a_clear_error_that_leaves_no_descriptor_open(objects: LocalObjectStore) -> None:
    _write(objects, "packs/small", [b"data"], size_hint=None)
    open_before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(SnapshotStoreUnavailableError, match="negative offset"):
        objects.open_reader("packs/small", -1, LARGE)
    assert len(os.listdir("/proc/self/fd")) == open_before
