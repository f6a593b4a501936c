"""A turn's persisted context: opened when an execution starts, stored when the turn leaves it.

The operator's tools keep values for the rest of their turn in `ctx.context`
(`cairn.operator.run_context`). Each execution of the turn opens what the last one stored; when
the turn leaves this worker alive (it waits for a person or the client, or its job is handed
back), the context goes through the agent's declared serializer, is checked for the session's
secret values, and is stored sealed for the turn (`turns.context`), replacing what was there
(whose data key is shredded). A value that is not declared, does not fit its type, or holds a
secret is refused (`RunStateRefusedError`): nothing is stored and the turn fails saying which
key. A worker that dies loses what changed since the last store, as any state in memory. When
the turn ends in the worker, its context goes with it (a turn ended elsewhere, a cancelled one
waiting, say, keeps its sealed context until the session is deleted or the sealed-state sweep
finds its key orphaned).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cairn.durable.crypto import SealScope
from cairn.durable.sealing import Sealer
from cairn.engine.journal import Transaction
from cairn.errors import RunStateRefusedError
from cairn.operator import ContextSchema, LoadedAgents, RunContext
from cairn.redaction import KnownValues
from cairn.store.db import Connection
from cairn.store.sessions import SessionRecord
from cairn.store.turns import TurnRecord, update_turn

__all__ = ["CONTEXT_KIND", "TurnContext", "open_turn_context"]

# The kind of record a turn's sealed context belongs to.
CONTEXT_KIND = "run_context"


def _scope(session: SessionRecord, turn_id: str) -> SealScope:
    return SealScope(tenant=session.tenant, kind=CONTEXT_KIND, record_id=turn_id)


def _schema(agents: LoadedAgents, session: SessionRecord) -> ContextSchema:
    """The declared keys of the session's pinned agent (none for a session without one)."""
    if session.agent_version is None:
        return ContextSchema()
    return agents.pinned(session.agent_version, session.agent_revision).agent.context_schema


@dataclass(slots=True)
class TurnContext:
    """One execution's view of its turn's context: the values its tools see, and what is stored."""

    session: SessionRecord
    turn_id: str
    schema: ContextSchema
    values: RunContext
    stored: dict[str, Any]  # what the turn's row holds now, as JSON
    blob: bytes | None  # and sealed

    @property
    def is_empty(self) -> bool:
        """Nothing to keep and nothing kept: a store or a drop would write nothing."""
        return not self.values and self.blob is None

    async def drop(self, tx: Transaction, sealer: Sealer) -> None:
        """The turn is over: what it kept goes (the column cleared, its data key shredded)."""
        if self.blob is None:
            return
        await sealer.shred(tx.conn, self.blob)
        await update_turn(tx.conn, self.turn_id, context=None)
        self.stored, self.blob = {}, None

    async def store(self, tx: Transaction, sealer: Sealer, known: KnownValues) -> None:
        """Store the context in `tx` (the turn's fenced transaction) if it changed; raises
        `RunStateRefusedError`, before anything is written, for what must not be stored."""
        dumped = self.schema.dump(self.values)
        holding = [key for key, value in dumped.items() if known.redactor.finds(value)]
        if holding:
            raise RunStateRefusedError(
                f"the run's context value {holding[0]!r} holds a secret value of the session (a credential, or a value "
                "registered for redaction); a paused run never stores one: use ctx.credentials in each execution instead",
                context={"key": holding[0]},
            )
        if dumped == self.stored:
            return
        blob = await sealer.seal_json(tx.conn, dumped, _scope(self.session, self.turn_id)) if dumped else None
        await sealer.shred(tx.conn, self.blob)
        await update_turn(tx.conn, self.turn_id, context=blob)
        self.stored, self.blob = dumped, blob


async def open_turn_context(
    conn: Connection, sealer: Sealer, agents: LoadedAgents, session: SessionRecord, turn: TurnRecord
) -> TurnContext:
    """The context the turn's last execution stored, validated by its declared types again;
    `StateDeserializeError` when it does not open or no longer fits."""
    schema = _schema(agents, session)
    stored: dict[str, Any] = {}
    if turn.context is not None:
        stored = dict(await sealer.open_json(conn, turn.context, _scope(session, turn.id)))
    return TurnContext(session, turn.id, schema, RunContext(schema.load(stored)), stored, turn.context)
