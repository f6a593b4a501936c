"""Human approval of tool calls (docs/approvals.md): the gate that holds a call for a person's
decision and checks it again before the call runs, the decisions, and their expiry."""

from cairn.engine.approvals.decide import Decision, DecisionRequest, apply_decision, decide
from cairn.engine.approvals.digest import ApprovalKey, canonical_json, schema_hash
from cairn.engine.approvals.expiry import expire_approvals
from cairn.engine.approvals.gate import RUN_STATE_VERSION, ApprovalGate, approval_request
from cairn.engine.approvals.render import render_approval, show_approval

__all__ = [
    "RUN_STATE_VERSION",
    "ApprovalGate",
    "ApprovalKey",
    "Decision",
    "DecisionRequest",
    "apply_decision",
    "approval_request",
    "canonical_json",
    "decide",
    "expire_approvals",
    "render_approval",
    "schema_hash",
    "show_approval",
]
