from __future__ import annotations

import pytest

from cairn.snapshots import Exclusions, InvalidExclusionError
from cairn.snapshots.exclusions import normalize_relative_path


@pytest.mark.parametrize(
    ("given", "expected"),
    [("a/b", "a/b"), ("./a//b/", "a/b"), ("/workspace/a/b", "a/b"), ("cache", "cache")],
)
def test_paths_are_normalized_relative_to_the_workspace(given: str, expected: str) -> None:
    assert normalize_relative_path(given) == expected


@pytest.mark.parametrize("bad", ["", "/", "/etc/passwd", "../up", "a/../../b", "/workspace/.."])
def test_paths_outside_the_workspace_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidExclusionError):
        normalize_relative_path(bad)


@pytest.mark.parametrize("ephemeral", ["data", "data/sub", "/workspace/data/sub/deeper"])
def test_an_exclusion_overlapping_a_mount_is_an_error(ephemeral: str) -> None:
    exclusions = Exclusions(mounts=["/workspace/data/sub"])
    with pytest.raises(InvalidExclusionError):
        exclusions.add_ephemeral(ephemeral)


def test_a_mount_overlapping_an_exclusion_is_an_error() -> None:
    exclusions = Exclusions(ephemeral=["cache"])
    with pytest.raises(InvalidExclusionError):
        exclusions.add_mount("cache/mnt")
    exclusions.add_mount("cached")  # a shared prefix of characters is not an overlap


def test_excluded_paths_cover_their_subtree_only() -> None:
    exclusions = Exclusions(ephemeral=["node_modules"], mounts=["mnt/data"])
    assert exclusions.is_excluded("node_modules")
    assert exclusions.is_excluded("node_modules/x/y")
    assert exclusions.is_excluded("mnt/data/file")
    assert not exclusions.is_excluded("mnt")
    assert not exclusions.is_excluded("node_modules2")
    exclusions.remove_mount("mnt/data")
    assert not exclusions.is_excluded("mnt/data/file")
