"""The operation key of a side-effecting call, and the digest of its arguments.

The key is derived by the engine, never chosen by the model (design invariant 5): the
tenant; the approval the call runs under, or else the turn and the call id; the tool's name;
and the tool's target by its `key=` function (the release id). It is the same on every
attempt of the call, in every worker, so the tool can pass it downstream as an
`Idempotency-Key`. The arguments digest is stored beside it: a claim of the same key with
other arguments is refused (a recorded call changed behind Cairn's back).

Both are SHA-256 over RFC 8785 canonical JSON (`cairn.engine.approvals.canonical_json`),
unkeyed: they name an operation, they do not authorize it (the approval's keyed digest does).
"""

from __future__ import annotations

import hashlib

from pydantic_core import to_jsonable_python

from cairn.engine.approvals.digest import canonical_json
from cairn.engine.tools.operator import OperatorTool
from cairn.engine.tools.pipeline import CallInFlight
from cairn.store.ledger import Operation

__all__ = ["operation_of"]

_PREFIX = "op_"


def operation_of(call: CallInFlight, tool: OperatorTool) -> Operation:
    """What the call claims: its operation key and argument digest, and whose call it is.
    Raises what the tool's `key=` function raises, or `InvalidRequestError` for a target that
    is not JSON."""
    ctx = call.context
    approval_id = ctx.approval.id if ctx.approval is not None else None
    scope = {"approval_id": approval_id} if approval_id is not None else {"turn_id": ctx.turn_id, "call_id": ctx.call_id}
    identity = {"tenant": ctx.tenant, **scope, "tool": tool.name, "target": to_jsonable_python(tool.target(call.arguments))}
    return Operation(
        operation_key=_PREFIX + hashlib.sha256(canonical_json(identity)).hexdigest(),
        tenant=ctx.tenant,
        session_id=ctx.session.id,
        turn_id=ctx.turn_id,
        call_id=ctx.call_id,
        approval_id=approval_id,
        tool_name=tool.name,
        arguments_digest=hashlib.sha256(canonical_json(call.call.arguments)).hexdigest(),
    )
