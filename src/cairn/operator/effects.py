"""What a side-effecting tool tells the idempotency ledger (docs/ledger.md).

A `@cairn.tool(side_effect=True)` may add:

- `key=`: a function of the parsed arguments naming the call's target (the release id). It
  becomes part of the operation key the engine derives (never the model), which the tool
  receives as `ctx.operation_key` to pass downstream as an `Idempotency-Key`.
- `probe=`: `probe(ctx, arguments) -> ProbeAnswer`, sync or async, asked when a worker died
  while the tool ran and nobody knows whether it took effect: it looks the effect up (is the
  release deployed?) and answers `ProbeAnswer.happened(result)`, `ProbeAnswer.did_not_happen()`
  or `ProbeAnswer.unsure(reason)`. Without a probe, or unsure, the effect becomes `uncertain`
  and a person resolves it.

This module only describes; the engine's ledger acts on it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cairn.operator.context import ToolContext

__all__ = ["KeyFunction", "Probe", "ProbeAnswer", "ProbeVerdict"]

# The call's target from its parsed arguments (a mapping of parameter names to values).
KeyFunction = Callable[[Mapping[str, Any]], Any]
# Did the call whose worker died take effect? `arguments` as for `KeyFunction`.
Probe = Callable[[ToolContext, Mapping[str, Any]], "ProbeAnswer | Awaitable[ProbeAnswer]"]


class ProbeVerdict(StrEnum):
    HAPPENED = "happened"
    DID_NOT_HAPPEN = "did_not_happen"
    UNSURE = "unsure"


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    """A probe's answer; build it with `happened`, `did_not_happen` or `unsure`."""

    verdict: ProbeVerdict
    # happened: what the tool would have returned (a string as it is, anything else as JSON).
    result: Any = None
    # unsure: why, for the person who resolves the effect.
    reason: str | None = None

    @classmethod
    def happened(cls, result: Any) -> ProbeAnswer:
        """The effect took place; `result` becomes the call's result."""
        return cls(ProbeVerdict.HAPPENED, result=result)

    @classmethod
    def did_not_happen(cls) -> ProbeAnswer:
        """The effect surely did not take place: the call may run (again)."""
        return cls(ProbeVerdict.DID_NOT_HAPPEN)

    @classmethod
    def unsure(cls, reason: str) -> ProbeAnswer:
        """The probe cannot tell: the effect is `uncertain` and a person decides."""
        return cls(ProbeVerdict.UNSURE, reason=reason)
