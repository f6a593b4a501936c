"""The approvals gate: a call that its agent says needs a person's approval waits for one, and
runs only under an approval that still holds when it is about to run.

The deployment's `GatePolicy` (installed by `cairn.bootstrap`). For each call of a session
pinned to an operator agent, it asks the pinned version's `approval_for(tool, arguments)`:

- None: the call goes on.
- no approval yet: one is stored (`pending`, with its expiry, its digest and its run state)
  and the call is held; the session shows an `mcp_approval_request` naming it. Design
  invariant 2: nothing of the call has run, and nothing runs past a hold.
- pending: held again (or expired, if its time ran out).
- rejected, expired, revoked, invalidated: finished with a result the model sees; the tool
  never runs.
- approved: checked again now, in this worker (design invariant 4), against what holds
  *now*: the tenant, the expiry, the pinned version still loaded with the revision the
  approval was made under, the digest recomputed from the recorded call, the run state's
  references, and the deciding key's current existence and role. A failed check ends the
  approval (`invalidated` or `expired`, with the reason), logs an audit line without the
  arguments, and finishes the call with why. Otherwise the approval is marked started (from
  then on it cannot be revoked) and the call proceeds with `ToolContext.approval` filled.
- approved and already started: the call may have run. If the reserve stage covers it (the
  idempotency ledger, keyed by the approval id), the call goes on to it with
  `ToolContext.approval` filled, and the ledger decides: the stored result, a wait, or
  `uncertain`; never a second execution. Otherwise it is finished as "not run again".

The review, summary and run state are stored sealed (`cairn.engine.approvals.sealed`) and
opened for a pending or approved-unstarted approval. One that does not open is never
continued: the approval becomes `invalidated` (`state_deserialize_failure`) and the turn
fails with that error (`StateDeserializeError`), so nothing of the call runs.

After a crash the gate vouches for every call whose approval has not started: it never ran.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from cairn._concurrency import run_sync
from cairn.config import Settings
from cairn.durable.sealing import Sealer
from cairn.engine.approvals.digest import ApprovalKey, schema_hash
from cairn.engine.approvals.explain import explain
from cairn.engine.approvals.sealed import open_state, seal_state
from cairn.engine.journal import Journal, Transaction
from cairn.engine.tools.base import ApprovalView, Hold, ToolResult
from cairn.engine.tools.gate import GatePolicy
from cairn.engine.tools.pipeline import PROCEED, CallInFlight, Finish, Verdict
from cairn.engine.tools.reserve import ReserveNothing, ReservePolicy
from cairn.errors import CairnMisuseError, RunStateRefusedError, StateDeserializeError
from cairn.ids import new_approval_id
from cairn.operator import ApprovalRequirement, LoadedAgent, LoadedAgents
from cairn.states import ApprovalReason, ApprovalStatus
from cairn.store.approvals import (
    ApprovalRecord,
    database_time,
    get_call_approval,
    insert_approval,
    mark_started,
    transition_approval,
)
from cairn.store.keys import get_key

__all__ = ["RUN_STATE_VERSION", "ApprovalGate", "approval_request"]

log = logging.getLogger(__name__)

# The schema of an approval's run state; a record of another version is not continued.
# Version 2: review, summary and run state sealed (version 1 kept them in clear).
RUN_STATE_VERSION = 2


def approval_request(approval: ApprovalRecord) -> Hold:
    """The hold of a call waiting for `approval` (its state opened): the session's
    `mcp_approval_request`."""
    request = {
        "type": "mcp_tool_call",
        "server_label": (approval.run_state or {}).get("server_label", approval.agent_version),
        "name": approval.tool_name,
        "arguments": approval.review,
        "message": approval.summary,
    }
    return Hold(call_id=approval.call_id, action_kind="mcp_approval_request", action={"request_id": approval.id, "request": request})


class ApprovalGate(GatePolicy):
    def __init__(
        self, journal: Journal, agents: LoadedAgents, settings: Settings, sealer: Sealer, *, reserve: ReservePolicy | None = None
    ) -> None:
        self._journal = journal
        self._agents = agents
        self._settings = settings
        self._sealer = sealer
        # The reserve stage after this gate: a call it covers is handed on to it even when its
        # approval already started (it may have run; the reserve stage knows).
        self._reserve = reserve if reserve is not None else ReserveNothing()
        self._key: ApprovalKey | None = None

    async def run(self, call: CallInFlight) -> Verdict:
        session = call.context.session
        if session.agent_version is None:
            return PROCEED  # not an operator agent's session: nothing asks for approval
        pinned = self._pinned(call)
        if pinned is not None and not pinned.may_need_approval(call.tool.name):
            return PROCEED  # no call of this tool ever needs one: no approval to look up
        key = await self._load_key()
        async with self._journal.db.read() as conn:
            held = await get_call_approval(conn, call.context.turn_id, call.call.call_id) is not None
        record: ApprovalRecord | None = None
        ttl_s = self._settings.approval_ttl_s
        if not held:
            if pinned is None:
                # Fail closed: without its agent nobody can say whether the call needs approval.
                return Finish(ToolResult(error=f"the agent version {session.agent_version} this session is pinned to is not "
                                               "loaded by this worker (or has changed); the call did not run"))
            # The operator's policy and review run outside any transaction: they are its code.
            requirement = pinned.approval_for(call.tool.name, call.call.arguments)
            if requirement is None:
                return PROCEED
            record = _new_record(call, pinned, requirement, _digest(key, call, pinned))
            if call.context.known_values.redactor.finds([record.review, record.summary, record.run_state]):
                # The review is the operator's code over the (redacted) arguments: it added one.
                raise RunStateRefusedError(f"the approval request of {call.tool.name} would show a secret value of the "
                                           "session in its review; the call is not held and the turn cannot pause")
            ttl_s = requirement.ttl_s if requirement.ttl_s is not None else ttl_s
        # A pending state is kept at most its time to live: the approval expires by then.
        ttl_s = min(ttl_s, self._settings.run_state_ttl_pending_s)
        unreadable: StateDeserializeError | None = None
        async with self._journal.transaction(session.id) as tx:
            approval = await get_call_approval(tx.conn, call.context.turn_id, call.call.call_id)
            if approval is None:
                if record is None:
                    raise CairnMisuseError(f"the approval of call {call.call.call_id} is gone from the database")
                approval = await insert_approval(tx.conn, await seal_state(self._sealer, tx.conn, record), ttl_s=ttl_s)
                log.info("approval %s: %s call %s of session %s held for a decision", approval.id, approval.tool_name,
                         approval.call_id, approval.session_id)
            if not _continues(approval):
                return await self._decided(tx, call, approval, key)
            try:
                opened = await open_state(self._sealer, tx.conn, approval)
            except StateDeserializeError as exc:
                unreadable = exc
                await self._end(tx, approval, ApprovalStatus.INVALIDATED, ApprovalReason.STATE_DESERIALIZE_FAILURE)
            else:
                return await self._decided(tx, call, opened, key)
        # Committed: the approval says why; the turn fails with the same error, and no call runs.
        assert unreadable is not None
        raise unreadable

    async def vouches_for_rerun(self, call: CallInFlight) -> bool:
        async with self._journal.db.read() as conn:
            approval = await get_call_approval(conn, call.context.turn_id, call.call.call_id)
        return approval is not None and not approval.is_started

    # -- a call that already has its approval --------------------------------------------

    async def _decided(self, tx: Transaction, call: CallInFlight, approval: ApprovalRecord, key: ApprovalKey) -> Verdict:
        if approval.status == ApprovalStatus.PENDING:
            if await database_time(tx.conn) < approval.expires_at:
                return approval_request(approval)
            return await self._end(tx, approval, ApprovalStatus.EXPIRED, ApprovalReason.EXPIRED)
        if approval.status != ApprovalStatus.APPROVED:
            return Finish(ToolResult(error=explain(approval)))
        if approval.is_started:
            if not self._reserve.covers(call):
                return Finish(ToolResult(error=f"the approved call was already started once (approval {approval.id}); "
                                               "it is not run again"))
            # It may have run: the reserve stage's ledger, keyed by this approval, decides.
            call.context = dataclasses.replace(call.context, approval=_view(approval))
            return PROCEED
        failure = await self._recheck(tx, call, approval, key)
        if failure is not None:
            status, reason = failure
            return await self._end(tx, approval, status, reason)
        started = await mark_started(tx.conn, approval)
        if started is None:
            return Finish(ToolResult(error=f"approval {approval.id} was revoked before the call started; the tool did not run"))
        call.context = dataclasses.replace(call.context, approval=_view(started))
        log.info("approval %s: approved %s call %s starts", started.id, started.tool_name, started.call_id)
        return PROCEED

    async def _recheck(
        self, tx: Transaction, call: CallInFlight, approval: ApprovalRecord, key: ApprovalKey
    ) -> tuple[ApprovalStatus, ApprovalReason] | None:
        """What no longer holds for an approved call about to run, or None when all does."""
        session = call.context.session
        if approval.tenant != session.tenant or approval.session_id != session.id:
            return ApprovalStatus.INVALIDATED, ApprovalReason.TENANT_MISMATCH
        if await database_time(tx.conn) >= approval.expires_at:
            return ApprovalStatus.EXPIRED, ApprovalReason.EXPIRED
        agent = self._pinned(call)
        if (
            agent is None
            or approval.run_state_version != RUN_STATE_VERSION
            or (agent.version, agent.revision) != (approval.agent_version, approval.agent_revision)
        ):
            return ApprovalStatus.INVALIDATED, ApprovalReason.MIGRATION_REQUIRED
        if approval.run_state != _run_state(call, agent):
            return ApprovalStatus.INVALIDATED, ApprovalReason.RUN_STATE_MISMATCH
        if approval.arguments_digest != _digest(key, call, agent):
            return ApprovalStatus.INVALIDATED, ApprovalReason.DIGEST_MISMATCH
        requirement = agent.approval_for(call.tool.name, call.call.arguments)
        approvers = requirement.approvers if requirement is not None else frozenset(approval.approvers)
        decider = await get_key(tx.conn, approval.decided_by) if approval.decided_by is not None else None
        if decider is None or decider.revoked_at is not None or decider.tenant != approval.tenant or decider.role not in approvers:
            return ApprovalStatus.INVALIDATED, ApprovalReason.APPROVER_LOST_RIGHTS
        return None

    async def _end(self, tx: Transaction, approval: ApprovalRecord, status: ApprovalStatus, reason: ApprovalReason) -> Finish:
        ended = await transition_approval(tx.conn, approval, status, reason=reason, unstarted=True)
        # The audit line names the call, never its arguments (design invariant 6).
        log.warning("approval %s %s (%s): %s call %s of session %s did not run", ended.id, status, reason,
                    ended.tool_name, ended.call_id, ended.session_id)
        return Finish(ToolResult(error=explain(ended)))

    # -- the call's identity -------------------------------------------------------------

    def _pinned(self, call: CallInFlight) -> LoadedAgent | None:
        """The session's pinned agent version as this worker loaded it, if its revision is the pinned one."""
        session = call.context.session
        agent = self._agents.get(session.agent_version) if session.agent_version is not None else None
        return agent if agent is not None and agent.revision == session.agent_revision else None

    async def _load_key(self) -> ApprovalKey:
        """The deployment's digest key, read (or made) once per process, off the event loop."""
        if self._key is None:
            self._key = await run_sync(ApprovalKey.of, self._settings)
        return self._key


def _continues(approval: ApprovalRecord) -> bool:
    """Whether the gate goes on from `approval`'s state: it is pending (its request is shown
    again) or approved and not started (its checks read the run state)."""
    if approval.status == ApprovalStatus.PENDING:
        return True
    return approval.status == ApprovalStatus.APPROVED and not approval.is_started


def _view(approval: ApprovalRecord) -> ApprovalView:
    """What the tool sees of the started `approval` it runs under."""
    assert approval.decided_by is not None and approval.decided_role is not None
    return ApprovalView(id=approval.id, decided_by_key=approval.decided_by, decided_role=approval.decided_role,
                        arguments_digest=approval.arguments_digest)


def _digest(key: ApprovalKey, call: CallInFlight, agent: LoadedAgent) -> str:
    """The digest of the call as recorded: who, where, which tool and schema, which agent, what arguments."""
    session = call.context.session
    identity = {
        "tenant": session.tenant,
        "session_id": session.id,
        "turn_id": call.context.turn_id,
        "call_id": call.call.call_id,
        "tool": call.tool.name,
        "tool_schema": schema_hash(call.tool.name, call.tool.spec.parameters),
        "agent_version": agent.version,
        "agent_revision": agent.revision,
        "arguments": call.call.arguments,
    }
    return key.digest(identity)


def _new_record(call: CallInFlight, agent: LoadedAgent, requirement: ApprovalRequirement, digest: str) -> ApprovalRecord:
    """A pending approval of `call`, as `requirement` asks for it (its times are set when stored)."""
    session = call.context.session
    return ApprovalRecord(
        id=new_approval_id(),
        tenant=session.tenant,
        session_id=session.id,
        turn_id=call.context.turn_id,
        call_id=call.call.call_id,
        tool_name=call.tool.name,
        review=dict(requirement.review),
        summary=requirement.summary,
        arguments_digest=digest,
        agent_version=agent.version,
        agent_revision=agent.revision,
        approvers=sorted(requirement.approvers),
        run_state=_run_state(call, agent),
        run_state_version=RUN_STATE_VERSION,
        status=ApprovalStatus.PENDING,
        reason=None,
        message=None,
        created_at=0.0,
        expires_at=0.0,
    )


def _run_state(call: CallInFlight, agent: LoadedAgent) -> dict[str, Any]:
    """What continues exactly this call, by reference: the call's item (by turn and call id) and
    the pinned agent; nothing a runtime dependency provides."""
    return {
        "turn_id": call.context.turn_id,
        "call_id": call.call.call_id,
        "agent_version": agent.version,
        "agent_revision": agent.revision,
        "server_label": agent.name,
    }

