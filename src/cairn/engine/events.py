"""Builders for the event payloads of spec §4; `event_id` and `sequence_number` are added
when the journal appends them."""

from __future__ import annotations

from typing import Any

from cairn.engine.wire import render_session, render_turn
from cairn.store.items import ItemRecord
from cairn.store.sessions import SessionRecord
from cairn.store.turns import TurnRecord

__all__ = [
    "agent_id_of",
    "command_output_delta",
    "environment_event",
    "item_event",
    "session_event",
    "text_part_event",
    "turn_event",
]


def agent_id_of(session_id: str) -> str:
    """Sessions carry their own agent configuration; its id is derived from the session's."""
    return f"agent_{session_id.removeprefix('sess_')}"


def session_event(kind: str, session: SessionRecord) -> dict[str, Any]:
    return {"type": f"agent.session.{kind}", "session_id": session.id, "session": render_session(session)}


def turn_event(kind: str, turn: TurnRecord, **extra: Any) -> dict[str, Any]:
    return {
        "type": f"agent.session.turn.{kind}",
        "session_id": turn.session_id,
        "turn_id": turn.id,
        "turn": render_turn(turn, agent_id=agent_id_of(turn.session_id)),
        **extra,
    }


def item_event(kind: str, item: ItemRecord, output_index: int | None) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "type": f"agent.session.turn.item.{kind}",
        "session_id": item.session_id,
        "turn_id": item.turn_id,
        "item": item.wire(),
    }
    if output_index is not None:
        payload["output_index"] = output_index
    return payload


def text_part_event(kind: str, item: ItemRecord, output_index: int, **fields: Any) -> dict[str, Any]:
    """`content_part.added|done` and `output_text.delta|done` of the message's only part."""
    return {
        "type": f"agent.session.turn.{kind}",
        "session_id": item.session_id,
        "turn_id": item.turn_id,
        "item_id": item.id,
        "output_index": output_index,
        "content_index": 0,
        **fields,
    }


def command_output_delta(item: ItemRecord, text: str) -> dict[str, Any]:
    """A piece of a running command's output, streamed before the command's item is done."""
    return {
        "type": "agent.output.command_execution_output.delta",
        "session_id": item.session_id,
        "turn_id": item.turn_id,
        "item_id": item.id,
        "output_index": item.output_index,
        "delta": text,
    }


def environment_event(kind: str, session: SessionRecord, *, status: str, turn_id: str | None = None) -> dict[str, Any]:
    return {
        "type": f"agent.session.environment.{kind}",
        "session_id": session.id,
        "turn_id": turn_id,
        "environment": {"id": session.environment_id, "type": session.environment["type"], "status": status},
    }
