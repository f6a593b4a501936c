"""The operator's runtime dependencies: what its agents and tools need that is not data.

Database pools, HTTP clients, service credentials: things an operator's code builds once per
process and that must never end up in a stored run state (design invariant 6). A registry's
`deps` provider is called once in every process that loads the registry (`cairn serve`,
`cairn worker`), so each process has its own; factories build their agents from them and
tools reach them through `ToolContext.deps`. Nothing of them is stored or sent anywhere:
`RuntimeDeps` is a read-only mapping that refuses to be pickled, copied into another process
or encoded as JSON.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

__all__ = ["RuntimeDeps"]


class RuntimeDeps(Mapping[str, Any]):
    """A read-only mapping of names to the operator's runtime objects; `deps["db"]` or `deps.db`."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        values = dict(values or {})
        for key in values:
            if not isinstance(key, str) or not key:
                raise TypeError(f"runtime dependency names are non-empty strings, not {key!r}")
        object.__setattr__(self, "_values", values)

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise KeyError(f"no runtime dependency {name!r} (there are: {', '.join(sorted(self._values)) or 'none'})") from None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(exc.args[0]) from None

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError("RuntimeDeps are read-only")

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        # Names only: the values may hold credentials, and reprs end up in logs.
        return f"RuntimeDeps({', '.join(sorted(self._values))})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("RuntimeDeps are never serialized: each process builds its own (the registry's deps provider)")
