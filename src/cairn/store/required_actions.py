"""Required actions: what a waiting turn needs from the client, one row per pending call.

This module is the only writer of the `required_actions` table. A turn that stops for its
client's tool calls adds one action per call in the transaction that makes it wait; a
`tool_result` resolves its call's action; a turn that ends drops what is left of its own.
Each change touches only its rows, so two writers never lose each other's change (the
list used to be rewritten whole inside a JSON column of the session). Sessions read them
with `actions_of` (`cairn.store.sessions`); only a session in `requires_action` has any.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from cairn.store.db import Connection
from cairn.store.tables import required_actions

__all__ = ["RequiredAction", "actions_of", "add_required_actions", "drop_required_actions", "resolve_required_action"]


@dataclass(frozen=True, slots=True)
class RequiredAction:
    session_id: str
    turn_id: str
    call_id: str
    # The RequiredAction variant of spec §3.1 (`function_call` is the only one Cairn asks for).
    kind: str
    payload: dict[str, Any]


async def add_required_actions(conn: Connection, actions: Sequence[RequiredAction]) -> None:
    now = time.time()
    rows = [
        {"session_id": a.session_id, "turn_id": a.turn_id, "call_id": a.call_id, "kind": a.kind, "payload": a.payload,
         "created_at": now}
        for a in actions
    ]
    if rows:
        await conn.execute(sa.insert(required_actions), rows)


async def resolve_required_action(conn: Connection, turn_id: str, call_id: str) -> None:
    """The client answered `call_id`: its action is no longer pending (a call answered before
    its turn waited has none)."""
    await conn.execute(
        sa.delete(required_actions).where(required_actions.c.turn_id == turn_id, required_actions.c.call_id == call_id)
    )


async def drop_required_actions(conn: Connection, turn_id: str) -> None:
    """The turn ended (cancelled while it waited): nothing is asked of the client any more."""
    await conn.execute(sa.delete(required_actions).where(required_actions.c.turn_id == turn_id))


async def actions_of(conn: Connection, session_ids: Collection[str]) -> dict[str, tuple[RequiredAction, ...]]:
    """The pending actions of each of `session_ids` that has any, in the order they were asked."""
    if not session_ids:
        return {}
    stmt = (
        sa.select(required_actions)
        .where(required_actions.c.session_id.in_(session_ids))
        .order_by(required_actions.c.position)
    )
    found: dict[str, list[RequiredAction]] = {}
    for row in (await conn.execute(stmt)).all():
        action = RequiredAction(row.session_id, row.turn_id, row.call_id, row.kind, row.payload)
        found.setdefault(row.session_id, []).append(action)
    return {session_id: tuple(actions) for session_id, actions in found.items()}
