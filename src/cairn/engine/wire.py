"""Renders stored records as the wire objects of spec §3 (AgentSession, Turn).

Both HTTP responses and event payloads use these functions, so a session looks the same
whether it is fetched or streamed.
"""

from __future__ import annotations

from typing import Any

from cairn.store.required_actions import RequiredAction
from cairn.store.sessions import SessionRecord
from cairn.store.turns import TurnRecord

__all__ = ["render_required_action", "render_session", "render_turn", "render_usage"]


def render_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    input_tokens = int(usage.get("input_tokens", 0))
    output_tokens = int(usage.get("output_tokens", 0))
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": int(usage.get("cached_tokens", 0))},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": int(usage.get("reasoning_tokens", 0))},
        "total_tokens": input_tokens + output_tokens,
    }


def render_required_action(action: RequiredAction) -> dict[str, Any]:
    """A RequiredAction of spec §3.1, e.g. {type: function_call, call_id, name, arguments, turn_id};
    an approval request names its `request_id` instead of a call id."""
    if "request_id" in action.payload:
        return {"type": action.kind, **action.payload, "turn_id": action.turn_id}
    return {"type": action.kind, "call_id": action.call_id, **action.payload, "turn_id": action.turn_id}


def _session_agent(session: SessionRecord) -> dict[str, Any]:
    """The session's agent; a registered one also shows the version and revision it is pinned to."""
    if session.agent_version is None:
        return session.agent
    return {**session.agent, "version": session.agent_version, "revision": session.agent_revision}


def render_session(session: SessionRecord) -> dict[str, Any]:
    wire: dict[str, Any] = {
        "id": session.id,
        "object": "agent.session",
        "agent": _session_agent(session),
        "created_at": int(session.created_at),
        "last_active_at": int(session.last_active_at),
        "environment": session.environment,
        "error": session.error,
        "metadata": session.metadata,
        "required_actions": [render_required_action(a) for a in session.required_actions],
        "status": session.status,
        "usage": render_usage(session.usage),
        "vault_ids": list(session.vault_ids),
    }
    settings = {"prompt_cache_options": session.prompt_cache_options, "review": session.review,
                "spend_control": session.spend_control}
    wire.update({key: value for key, value in settings.items() if value is not None})
    return wire


def render_turn(turn: TurnRecord, *, agent_id: str) -> dict[str, Any]:
    wire: dict[str, Any] = {
        "id": turn.id,
        "object": "agent.session.turn",
        "agent_id": agent_id,
        "session_id": turn.session_id,
        "created_at": int(turn.created_at),
        "started_at": int(turn.started_at) if turn.started_at is not None else None,
        "completed_at": int(turn.completed_at) if turn.completed_at is not None else None,
        "status": turn.status,
        "subagent_id": None,
        "usage": render_usage(turn.usage),
    }
    if turn.error is not None:
        wire["error"] = turn.error
    return wire
