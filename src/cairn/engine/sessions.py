"""Session operations behind the HTTP API: create, update, delete, and input events.

Input events (message, cancel, tool_result, mcp_approval_request_result) of one request are
applied in one journal transaction under a lock on the session row, together with their
idempotency key: either all take effect and the key is recorded, or none does. A message
sent while a turn is active is queued as the next turn (spec §5 allows rejecting; queueing
loses nothing), except while the turn waits for a person's approval: then it is refused
with 409, since the decision belongs to the approver, not to whoever sends the next message.
An approval result is decided by the rules of every decision (`cairn.engine.approvals`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cairn.engine.approvals.decide import Decision, DecisionRequest, apply_decision
from cairn.engine.environment import decode_inline_files
from cairn.engine.events import environment_event, session_event, turn_event
from cairn.engine.journal import Transaction
from cairn.engine.lifecycle import add_call_output, close_turn, queue_turn_job, queue_workspace_removal, set_session_status
from cairn.engine.loop.waiting import release_hold
from cairn.engine.retention import delete_session_state
from cairn.engine.runtime import Runtime
from cairn.engine.session_agent import new_session_agent, updated_agent
from cairn.engine.vaults.injection import check_session_env, open_credentials
from cairn.errors import CairnMisuseError, ConflictError, InvalidRequestError, NotFoundError
from cairn.ids import new_environment_id, new_session_id, new_turn_id
from cairn.sandbox.base import SandboxBackend
from cairn.sandbox.egress import NetworkPolicy
from cairn.states import ApprovalReason, EnvironmentStatus, ItemStatus, SessionStatus, TurnStatus
from cairn.store.approvals import Decider, close_approvals
from cairn.store.db import Connection
from cairn.store.idempotency import record_idempotency_key
from cairn.store.items import pending_client_calls
from cairn.store.required_actions import resolve_required_action
from cairn.store.session_files import insert_session_files
from cairn.store.sessions import SessionRecord, allocate_turn_ordinal, delete_session, get_session, insert_session, update_session
from cairn.store.turns import (
    ACTIVE_STATUSES,
    TurnRecord,
    active_turn,
    get_turn,
    insert_turn,
    next_queued_turn,
    update_turn,
)
from cairn.store.vaults import existing_vaults

__all__ = ["CreatedSession", "SessionService"]

_DELETE_RETRY_AFTER_MS = 1000
# The Agents API's decisions on an `mcp_approval_request` (spec §5).
_AGENTS_API_DECISIONS = {"approve": Decision.APPROVE, "deny": Decision.REJECT, "cancel": Decision.DISMISS}
# Settings a session keeps as given at create, and that an update may change.
_SETTINGS = ("prompt_cache_options", "review", "spend_control")


@dataclass(frozen=True, slots=True)
class CreatedSession:
    session: SessionRecord
    first_event_seq: int
    turn_id: str | None


def _environment_view(environment: Mapping[str, Any], environment_id: str, sandbox: SandboxBackend) -> dict[str, Any]:
    """The response shape of spec §3.5 for a Cairn-hosted environment, plus what isolates it
    (an unconfined backend must say so in every session on it: design invariant 8)."""
    if environment["type"] == "none":
        return {"type": "none"}
    network = environment.get("network") or {}
    return {
        "type": "openai_hosted",
        "id": environment_id,
        "capability_directories": [],
        "files": [
            {"type": "inline", "id": f"file_{i}", "path": f["path"], "size_bytes": len(f.get("data", "")) * 3 // 4}
            for i, f in enumerate(environment.get("files") or [])
        ],
        "network": _network_view(network),
        "packages": {"npm": [], "python": [], "system": []},
        "plugins": [],
        "skills": [],
        "container_size": environment.get("container_size") or "medium",
        "sandbox": {
            "backend": sandbox.name,
            "isolated": "isolation" in sandbox.capabilities,
            "description": sandbox.description,
        },
    }


async def _check_vaults(conn: Connection, tenant: str, vault_ids: Sequence[str]) -> None:
    """Every vault a new session names is one of its tenant's (another tenant's is unknown)."""
    found = await existing_vaults(conn, vault_ids, tenant=tenant)
    missing = [v for v in vault_ids if v not in found]
    if missing:
        raise InvalidRequestError(f"vault_ids: no vault found with id '{missing[0]}'", param="vault_ids")
def _network_view(network: Mapping[str, Any]) -> dict[str, Any]:
    """`environment.network` as stored and shown: the domain lists normalized (a malformed one
    is a 400 here), `blocked_domains` only when there are some (spec §3.5 shows access and
    allowed_domains; the egress proxy needs the blocked ones too)."""
    policy = NetworkPolicy.from_environment(dict(network))
    if policy is None:
        return {"access": "disabled", "allowed_domains": []}
    view: dict[str, Any] = {"access": policy.access, "allowed_domains": list(policy.allowed_domains)}
    if policy.blocked_domains:
        view["blocked_domains"] = list(policy.blocked_domains)
    return view


class SessionService:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    # -- reads ------------------------------------------------------------------------

    async def get(self, tenant: str, session_id: str) -> SessionRecord:
        async with self.rt.db.read() as conn:
            session = await get_session(conn, session_id, tenant=tenant)
        if session is None:
            raise NotFoundError(f"No session found with id '{session_id}'.", param="session_id")
        return session

    # -- create / update / delete -----------------------------------------------------

    async def create(self, tenant: str, body: Mapping[str, Any]) -> CreatedSession:
        """A new session; `body["agent_id"]` (optional) names a registered agent to pin."""
        session_id = new_session_id()
        agent, pinned = new_session_agent(self.rt.agents, session_id, body["agent"], body.get("agent_id"))
        self.rt.check_model(agent["model"])  # a bad model name is a 400 now, not a failed turn later
        environment = dict(body["environment"])
        inline_files = decode_inline_files(environment.get("files") or [])
        environment_id = new_environment_id()
        vault_ids = list(body.get("vault_ids") or [])
        now = time.time()
        record = SessionRecord(
            id=session_id,
            tenant=tenant,
            status=SessionStatus.IDLE,
            agent=agent,
            environment=_environment_view(environment, environment_id, self.rt.sandbox),
            environment_id=environment_id,
            metadata=dict(body.get("metadata") or {}),
            error=None,
            usage=None,
            last_event_seq=0,
            next_turn_ordinal=0,
            outputs_manifest={},
            created_at=now,
            last_active_at=now,
            # `env` is plain configuration, kept out of the rendered environment; a credential's
            # value in it is refused below (secrets belong in vaults: docs/security.md).
            env=dict(environment.get("env") or {}),
            environment_status=EnvironmentStatus.READY if environment["type"] != "none" else None,
            prompt_cache_options=body.get("prompt_cache_options"),
            review=body.get("review"),
            spend_control=body.get("spend_control"),
            agent_version=pinned.version if pinned is not None else None,
            agent_revision=pinned.revision if pinned is not None else None,
            vault_ids=vault_ids,
        )
        # The workspace itself is made by the worker that first runs a turn of the session,
        # from the files stored here (docs/workers.md): this process may not be that machine.
        async with self.rt.journal.transaction(session_id) as tx:
            await _check_vaults(tx.conn, tenant, vault_ids)
            if vault_ids and record.env:
                check_session_env(record.env, await open_credentials(tx.conn, self.rt.sealer, tenant, vault_ids))
            await insert_session(tx.conn, record)
            await insert_session_files(tx.conn, session_id, inline_files)
            tx.emit(session_event("created", record))
            if environment["type"] != "none":
                tx.emit(environment_event("pending", record, status="pending"))
                tx.emit(environment_event("ready", record, status="ready"))
            turn_id = None
            if body.get("input"):
                turn_id = (await self._queue_message(tx, record, body["input"])).id
            session = await get_session(tx.conn, session_id)
            assert session is not None
        return CreatedSession(session=session, first_event_seq=tx.appended[0].seq, turn_id=turn_id)

    async def update(self, tenant: str, session_id: str, body: Mapping[str, Any]) -> SessionRecord:
        async with self.rt.journal.transaction(session_id) as tx:
            session = await self._locked(tx, tenant, session_id)
            values: dict[str, Any] = {}
            if "agent" in body and body["agent"] is not None:
                agent = updated_agent(self.rt.agents, session, body["agent"])
                self.rt.check_model(agent["model"])
                values["agent"] = agent
            if "metadata" in body:
                values["metadata"] = dict(body["metadata"] or {})
            values.update({key: body[key] for key in _SETTINGS if key in body})
            return await update_session(tx.conn, session_id, last_active_at=time.time(), **values)

    async def delete(self, tenant: str, session_id: str) -> None:
        async with self.rt.journal.transaction(session_id) as tx:
            await self._locked(tx, tenant, session_id)
            running = await active_turn(tx.conn, session_id)
            if running is not None and running.status == TurnStatus.IN_PROGRESS:
                raise ConflictError(
                    f"Session {session_id} has a running turn ({running.id}); cancel it first "
                    "(POST /v1/agents/sessions/{id}/events with agent.session.input.cancel).",
                    code="session_busy",
                    retryable=False,
                    context={"retry_after_ms": _DELETE_RETRY_AFTER_MS},
                )
            # Its held and approved-but-unstarted calls never run; the approvals stay on record.
            await close_approvals(tx.conn, ApprovalReason.SESSION_DELETED, session_id=session_id)
            # Their sealed states and its ledger results go now, their data keys shredded.
            await delete_session_state(self.rt.sealer, tx.conn, session_id)
            await delete_session(tx.conn, session_id)
            # Its workspace and snapshots go where workspaces live: on a worker.
            await queue_workspace_removal(tx, tenant, session_id)
        self.rt.notifier.session_changed(session_id)

    # -- input events -----------------------------------------------------------------

    async def submit(
        self,
        tenant: str,
        session_id: str,
        events: Sequence[Mapping[str, Any]],
        *,
        idempotency: tuple[str, str] | None,
        decider: Decider | None = None,
    ) -> None:
        """Apply input events atomically; `idempotency` is (key, request digest), `decider` the
        calling key, which approval results need."""
        async with self.rt.journal.transaction(session_id) as tx:
            session = await self._locked(tx, tenant, session_id)
            if idempotency is not None and await record_idempotency_key(tx.conn, session_id, *idempotency):
                return
            for event in events:
                kind = event["type"]
                if kind == "agent.session.input.message":
                    await self._queue_message(tx, session, event["input"])
                elif kind == "agent.session.input.cancel":
                    await self._cancel(tx, session_id)
                elif kind == "agent.session.input.tool_result":
                    await self._tool_result(tx, session_id, event)
                elif kind == "agent.session.input.mcp_approval_request_result":
                    if decider is None or decider.tenant != tenant:
                        raise CairnMisuseError("an approval result is decided by a key, which submit was not given")
                    request = DecisionRequest(_AGENTS_API_DECISIONS[event["response"]["decision"]])
                    await apply_decision(tx, decider, event["request_id"], request, session_id=session_id)
                else:
                    raise InvalidRequestError(f"input event type {kind!r} is not supported by this server", param="events.type")
                refreshed = await get_session(tx.conn, session_id)
                assert refreshed is not None
                session = refreshed

    async def _locked(self, tx: Transaction, tenant: str, session_id: str) -> SessionRecord:
        session = await get_session(tx.conn, session_id, tenant=tenant, for_update=True)
        if session is None:
            raise NotFoundError(f"No session found with id '{session_id}'.", param="session_id")
        return session

    async def _queue_message(self, tx: Transaction, session: SessionRecord, messages: Sequence[Mapping[str, Any]]) -> TurnRecord:
        if session.status == SessionStatus.FAILED:
            raise ConflictError(f"session {session.id} has failed: {session.error}", code="session_failed")
        if any(action.kind == "mcp_approval_request" for action in session.required_actions):
            raise ConflictError(
                f"session {session.id} waits for the approval of a tool call; decide it (or cancel the turn) first",
                code="awaiting_approval",
                retryable=False,
            )
        busy = await active_turn(tx.conn, session.id) or await next_queued_turn(tx.conn, session.id)
        turn = TurnRecord(
            id=new_turn_id(),
            session_id=session.id,
            ordinal=await allocate_turn_ordinal(tx.conn, session.id),
            status=TurnStatus.QUEUED,
            input=[{"role": "user", "content": list(m["content"])} for m in messages],
            step=0,
            next_output_index=0,
            cancel_requested=False,
            lease_token=None,
            error=None,
            usage=None,
            created_at=time.time(),
            started_at=None,
            completed_at=None,
        )
        await insert_turn(tx.conn, turn)
        if busy is None:
            await set_session_status(tx, session.id, SessionStatus.IN_PROGRESS)
            await queue_turn_job(tx, turn)
        tx.emit(turn_event("created", turn))
        return turn

    async def _cancel(self, tx: Transaction, session_id: str) -> None:
        turn = await active_turn(tx.conn, session_id) or await next_queued_turn(tx.conn, session_id)
        if turn is None:
            return  # nothing to cancel: a no-op, as the spec allows
        if turn.status == TurnStatus.IN_PROGRESS:
            # The worker running it sees the flag, stops the step and closes the turn.
            await update_turn(tx.conn, turn.id, cancel_requested=True)
        else:
            await close_turn(tx, turn, TurnStatus.CANCELLED)

    async def _tool_result(self, tx: Transaction, session_id: str, event: Mapping[str, Any]) -> None:
        call_id = event["call_id"]
        turn = await get_turn(tx.conn, event["turn_id"], session_id=session_id)
        pending = await pending_client_calls(tx.conn, turn.id) if turn is not None and turn.status in ACTIVE_STATUSES else []
        call = next((c for c in pending if c.call_id == call_id), None)
        if turn is None or call is None:
            # The exact message the official client's race retry recognises (spec §6.4).
            raise InvalidRequestError(f"Unknown pending tool call: {call_id}", code="invalid_request_error", param="call_id")
        success = bool(event["success"])
        await tx.transition_item(call, ItemStatus.COMPLETED if success else ItemStatus.FAILED, data=call.data)
        error = None if success else event.get("error") or "the client reported a failure"
        await add_call_output(tx, call, output=event.get("output"), error=error)
        if turn.status == TurnStatus.WAITING:
            # The turn resumes only when nothing else holds it: other client calls, or a call
            # the gate holds (an approval) stay required actions until they end.
            await release_hold(tx, turn.id, call_id)
        else:
            # Answered while the turn still runs the step's other calls: it never waits for it.
            await resolve_required_action(tx.conn, turn.id, call_id)

