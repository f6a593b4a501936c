"""The idempotency ledger (docs/ledger.md): every call of a side-effecting tool runs under an
entry keyed by an operation key the engine derives, so that a replay, a duplicate delivery
or a crash and retry yields at most one execution, and an outcome nobody can know becomes
`uncertain` for a person to resolve (design invariant 5).

`LedgerReserve` is the pipeline's reserve stage (installed by `cairn.bootstrap`);
`resolve_effect` is a person's answer; `sweep_ledger` the retention sweep.
"""

from cairn.engine.ledger.keys import operation_of
from cairn.engine.ledger.render import render_entry
from cairn.engine.ledger.resolve import RESOLVER_ROLES, resolve_effect
from cairn.engine.ledger.results import TOOL_RESULT_KIND, shown_result
from cairn.engine.ledger.stage import UNCERTAIN_EFFECT, LedgerReserve, uncertain_effect
from cairn.engine.ledger.sweep import sweep_ledger

__all__ = [
    "RESOLVER_ROLES",
    "TOOL_RESULT_KIND",
    "UNCERTAIN_EFFECT",
    "LedgerReserve",
    "operation_of",
    "render_entry",
    "resolve_effect",
    "shown_result",
    "sweep_ledger",
    "uncertain_effect",
]
