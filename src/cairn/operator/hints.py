"""Which parameter type hints a `@cairn.tool` accepts: those with a JSON schema a model can
fill and pydantic can check.

Checked when the function is decorated, so an operator learns of a hint Cairn cannot turn into
a schema at import time, not when a model first calls the tool.
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any, Literal, Union

import typing_extensions
from pydantic import BaseModel

__all__ = ["SUPPORTED", "unsupported_part"]

SUPPORTED = (
    "str, int, float, bool, list[...], dict[str, ...], Optional[...] or X | None, unions of these, "
    "Literal[...], an Enum, a pydantic model or a TypedDict"
)

_SCALARS: tuple[type, ...] = (str, int, float, bool)
_LITERAL_VALUES = (str, int, bool, type(None))


def unsupported_part(hint: Any) -> str | None:
    """The part of `hint` that has no JSON schema here (None when all of it has one)."""
    return _check(hint, seen=set())


def _check(hint: Any, *, seen: set[int]) -> str | None:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        return _check(args[0], seen=seen)
    if hint in _SCALARS:
        return None
    if origin is Literal:
        bad = [v for v in args if not isinstance(v, _LITERAL_VALUES)]
        return f"Literal value {bad[0]!r}" if bad else None
    if origin in (Union, types.UnionType):
        for arg in args:
            if arg is type(None):
                continue
            problem = _check(arg, seen=seen)
            if problem is not None:
                return problem
        return None
    if origin is list:
        return _check(args[0], seen=seen) if args else "list without an item type (write list[str], ...)"
    if origin is dict:
        if not args:
            return "dict without key and value types (write dict[str, ...])"
        if args[0] is not str:
            return f"dict keys of type {_name(args[0])} (JSON object keys are strings)"
        return _check(args[1], seen=seen)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        bad = [m for m in hint if not isinstance(m.value, (str, int))]
        return f"Enum {hint.__name__} with a value that is not a string or integer ({bad[0].value!r})" if bad else None
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return None  # pydantic's own schema; a field it cannot describe fails the schema build
    if typing_extensions.is_typeddict(hint):
        if id(hint) in seen:
            return None
        seen.add(id(hint))
        for field, field_hint in typing.get_type_hints(hint, include_extras=True).items():
            problem = _check(field_hint, seen=seen)
            if problem is not None:
                return f"{problem} (in {hint.__name__}.{field})"
        return None
    if hint is list or hint is dict:
        return f"bare {hint.__name__} (write {hint.__name__}[...] with its item types)"
    return _name(hint)


def _name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else repr(hint)
