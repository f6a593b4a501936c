"""What an operator tool sees of the call it runs.

`ToolContext` is the public view an operator's function receives as its first argument: whose
call it is (tenant, session, turn, call id), the approval it runs under if it needed one, the
operation key the idempotency ledger runs a side-effecting call under, the process's
runtime dependencies, and the credentials of the session's vaults, decrypted for this
execution (`cairn.operator.credentials`). It is built afresh for each call in the worker that
runs it and is never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cairn.operator.credentials import Credentials
from cairn.operator.deps import RuntimeDeps
from cairn.operator.run_context import RunContext
from cairn.redaction import KnownValues

__all__ = ["ApprovalView", "ToolContext"]


@dataclass(frozen=True, slots=True)
class ApprovalView:
    """The approval a call runs under: who decided it (their key and role at decision time)
    and the digest of the exact call they approved."""

    id: str
    decided_by_key: str
    decided_role: str
    arguments_digest: str


@dataclass(frozen=True, slots=True)
class ToolContext:
    tenant: str
    session_id: str
    turn_id: str
    call_id: str
    # The process's runtime dependencies (the registry's deps provider).
    deps: RuntimeDeps
    # Set when the call needed an approval and runs because a person approved it.
    approval: ApprovalView | None = None
    # Set for a `side_effect=True` tool: the key of its ledger entry, derived by Cairn (never
    # by the model) and the same on every attempt of this call; pass it downstream as an
    # `Idempotency-Key` so that the system doing the work deduplicates too (docs/ledger.md).
    operation_key: str | None = None
    # The session's credentials by name (`ctx.credentials["deploy-token"].token`).
    credentials: Credentials = field(default_factory=Credentials)
    # The run's persisted context: the agent's declared keys, kept across pauses and workers.
    context: RunContext = field(default_factory=RunContext)
    # What this execution redacts; `register_secret` adds to it.
    known_values: KnownValues = field(default_factory=KnownValues, repr=False)

    def register_secret(self, *values: str) -> None:
        """Have `values` (each at least 8 characters) replaced by `[redacted]` in everything this
        execution of the session stores from now on: items, events, results, log lines. For a
        secret the tool got from elsewhere (a token it fetched); the session's credentials are
        redacted without this. Values live in memory for this execution only: register them
        again when a later execution gets them again."""
        self.known_values.add(*values)
