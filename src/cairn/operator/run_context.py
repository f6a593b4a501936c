"""A run's persisted context: what an operator's tools keep for the rest of a turn, explicitly.

A turn can pause for days (an approval, a client tool) and be resumed by another worker;
what its tools want to carry across (the user, a request id, the locale, a ticket number,
feature flags) goes into `ctx.context`, a mapping that Cairn stores with the turn whenever
the turn leaves the worker that runs it, and gives back to the next execution. Nothing goes
in implicitly (the Agents SDK serializes whatever context object it was given, a token
included): an agent declares each key and its type,

    cairn.Agent(..., context={"user": str, "ticket": int | None, "flags": dict[str, bool]})

and each value is stored through that type's serializer (pydantic: JSON in, validated on the
way back). When the turn pauses, a key the agent does not declare, a value its type refuses,
or a value holding one of the session's secrets is refused with `RunStateRefusedError`: the
turn fails and says which key, and nothing is stored. Runtime objects (clients, pools)
belong in the registry's deps, and credentials in vaults (`ctx.credentials`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, NoReturn

from pydantic import PydanticSchemaGenerationError, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from cairn.errors import AgentDefinitionError, RunStateRefusedError, StateDeserializeError

__all__ = ["ContextSchema", "RunContext"]

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class ContextSchema:
    """The keys an agent declares for its runs' context, each with its type's serializer."""

    def __init__(self, fields: Mapping[str, Any] | None = None) -> None:
        self._adapters: dict[str, TypeAdapter[Any]] = {}
        self._schemas: dict[str, Any] = {}
        for key, type_ in dict(fields or {}).items():
            if not isinstance(key, str) or not _KEY.fullmatch(key):
                raise AgentDefinitionError(f"cairn.Agent context: {key!r} is not a key name (letters, digits and _, up to 64)")
            try:
                adapter: TypeAdapter[Any] = TypeAdapter(type_)
                schema = adapter.json_schema()
            except (PydanticSchemaGenerationError, TypeError) as exc:
                raise AgentDefinitionError(
                    f"cairn.Agent context: the type of {key!r} ({type_!r}) has no JSON form; declare data "
                    "(str, int, bool, lists, dicts, pydantic models…) and keep runtime objects in the registry's deps"
                ) from exc
            self._adapters[key] = adapter
            self._schemas[key] = schema

    def __bool__(self) -> bool:
        return bool(self._adapters)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self._adapters)

    def describe(self) -> dict[str, Any]:
        """Each key's JSON schema (part of the agent's revision: a changed type is a new revision)."""
        return dict(self._schemas)

    def dump(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`values` as JSON through each key's serializer; `RunStateRefusedError` for a key not
        declared or a value its type refuses (the message names the key, never the value)."""
        dumped: dict[str, Any] = {}
        for key, value in values.items():
            adapter = self._adapters.get(key)
            if adapter is None:
                declared = ", ".join(self._adapters) or "none"
                raise RunStateRefusedError(
                    f"the run's context holds {key!r}, which its agent does not declare (declared: {declared}); a run's "
                    "context is stored when the turn pauses, so each key needs a type in cairn.Agent(context=...). Keep "
                    "runtime objects in the registry's deps and secrets in vaults",
                    context={"key": key},
                )
            try:
                dumped[key] = adapter.dump_python(adapter.validate_python(value), mode="json")
            except (ValidationError, PydanticSerializationError) as exc:
                raise RunStateRefusedError(
                    f"the run's context value {key!r} does not fit its declared type: {_first_error(exc)}",
                    context={"key": key},
                ) from None
        return dumped

    def load(self, stored: Mapping[str, Any]) -> dict[str, Any]:
        """The values a run stored, validated by their types again."""
        loaded: dict[str, Any] = {}
        for key, value in stored.items():
            adapter = self._adapters.get(key)
            if adapter is None:
                raise StateDeserializeError(f"the run's stored context holds {key!r}, which its agent does not declare")
            try:
                loaded[key] = adapter.validate_python(value)
            except ValidationError as exc:
                raise StateDeserializeError(f"the run's stored context value {key!r} does not fit its type: "
                                            f"{_first_error(exc)}") from None
        return loaded


def _first_error(exc: ValidationError | PydanticSerializationError) -> str:
    if isinstance(exc, ValidationError):
        error = exc.errors(include_input=False)[0]
        where = ".".join(str(p) for p in error["loc"])
        return f"{where}: {error['msg']}" if where else str(error["msg"])
    return "it has no JSON form"


class RunContext(MutableMapping[str, Any]):
    """`ctx.context`: the run's persisted context, a mapping of the agent's declared keys.

    Any key can be set while a call runs; the check is when the turn pauses and the context
    is stored (`ContextSchema.dump`). It is never pickled: its only way into storage is the
    agent's declaration."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values: dict[str, Any] = dict(values or {})

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._values[key] = value

    def __delitem__(self, key: str) -> None:
        del self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"RunContext({', '.join(sorted(self._values))})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a run's context is stored only through its agent's declared types (cairn.Agent(context=...))")
