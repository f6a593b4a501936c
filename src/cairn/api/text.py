"""What counts as acceptable text at the API boundary, checked once, before anything is stored.

A JSON body may carry `\\ud800` (a lone surrogate): Python decodes it into a `str` that no
UTF-8 encoder, database driver or response renderer accepts, so it must be refused where it
enters, never discovered by a worker writing it later (issue 19). Names and ids (models,
metadata keys, file paths, path and query parameters) also refuse control characters, which
no such name legitimately holds and which databases and the OS treat specially (PostgreSQL
text cannot hold NUL; an OS path or environment variable cannot either).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from cairn.errors import InvalidRequestError

__all__ = ["CONTROL_CHARACTERS", "check_names", "check_text_tree", "describe_control"]

# C0 controls, DEL and C1 controls.
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f]")
_SURROGATES = re.compile("[\ud800-\udfff]")


def describe_control(value: str) -> str | None:
    """A short description of the first control character in `value`, or None if it has none."""
    found = CONTROL_CHARACTERS.search(value)
    return None if found is None else f"control character U+{ord(found.group()):04X}"


def _location(path: list[str | int]) -> str:
    return ".".join(str(part) for part in path)


def check_text_tree(data: Any) -> None:
    """Refuse a decoded JSON document holding a string (or key) that is not valid Unicode text.

    Walks iteratively, so the depth of the document cannot exhaust Python's stack. The error
    names the field in `param`, in pydantic's dotted form (`agent.tools.0.parameters`), and
    never echoes the bad text itself (the error would be unrenderable).
    """
    stack: list[tuple[Any, list[str | int]]] = [(data, [])]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if _SURROGATES.search(value):
                raise InvalidRequestError(
                    f"{_location(path) or 'body'}: text must be valid Unicode (it holds a lone surrogate, "
                    "which UTF-8 cannot encode)",
                    param=_location(path) or None,
                )
        elif isinstance(value, dict):
            for key, child in value.items():
                if _SURROGATES.search(key):
                    where = _location(path) or "body"
                    raise InvalidRequestError(
                        f"{where}: a key must be valid Unicode (it holds a lone surrogate, which UTF-8 cannot encode)",
                        param=_location(path) or None,
                    )
                stack.append((child, [*path, key]))
        elif isinstance(value, list):
            stack.extend((child, [*path, index]) for index, child in enumerate(value))


def check_names(pairs: Iterable[tuple[str, str]], *, kind: str) -> None:
    """Refuse control characters in request names and ids (path and query parameters)."""
    for name, value in pairs:
        for part, what in ((name, "name"), (value, "value")):
            problem = describe_control(part)
            if problem is not None:
                shown = CONTROL_CHARACTERS.sub("?", name)
                raise InvalidRequestError(f"{kind} {shown!r}: the {what} holds a {problem}", param=shown)
