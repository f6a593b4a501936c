"""The running turn's record: its history, and every write the turn makes.

The recorder owns what the worker knows of the session's items (`History`, loaded once per
job and kept current by the turn's own writes) and the turn's run state (step, usage, next
output index). Every write is a journal transaction whose first statement is the fence on
the job's lease token (for a model step, the fenced update of the run state itself), so a
worker that lost its lease cannot touch the turn (design invariant 1 for events; fencing
per style). The step counter advances in the transaction that records the step's calls, so
after a crash the turn resumes at the first unrecorded step (run state by reference: the
items are the history).

Stream deltas wait in the recorder until the next write or the periodic flush; one lock
orders all of the turn's writes, so deltas never overtake the events that follow them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from cairn.engine.events import item_event, text_part_event
from cairn.engine.journal import Journal, Transaction
from cairn.engine.loop.history import History
from cairn.engine.tools.base import Hold, Tool, ToolResult
from cairn.engine.tools.record import TurnWriter, announce_result, finished_call
from cairn.models.base import InputItem, ModelResponse, ToolCall, Usage
from cairn.states import ItemStatus
from cairn.store.items import ItemRecord, new_item, session_items
from cairn.store.jobs import Job
from cairn.store.sessions import SessionRecord
from cairn.store.turns import TurnRecord, advance_step, fence_turn, update_turn

__all__ = ["TurnRecorder"]


@dataclass(frozen=True, slots=True)
class _StepDone:
    """The run state a recorded model step leaves behind."""

    step: int
    usage: dict[str, int]
    next_output_index: int


class TurnRecorder(TurnWriter):
    def __init__(self, journal: Journal, job: Job, session: SessionRecord, turn: TurnRecord, items: Iterable[ItemRecord]) -> None:
        self._journal = journal
        self.job = job
        self.session = session
        self.turn = turn
        self._history = History(items)
        self._next_output_index = turn.next_output_index
        self._deltas: list[dict[str, Any]] = []
        self._lock = anyio.Lock()

    # -- writing ----------------------------------------------------------------------

    def write(self) -> AbstractAsyncContextManager[Transaction]:
        return self._transaction(None)

    @asynccontextmanager
    async def _transaction(self, step: _StepDone | None) -> AsyncIterator[Transaction]:
        """A journal transaction of the running turn, fenced by the job's lease token first (in
        one statement with the run state of a finished model `step`), that appends the deltas
        waiting to be sent before anything else it emits."""
        async with self._lock, self._journal.transaction(self.session.id) as tx:
            token = self.job.lease_token
            if step is None:
                await fence_turn(tx.conn, self.turn.id, token)
                turn = self.turn
            else:
                turn = await advance_step(
                    tx.conn, self.turn, token, step=step.step, usage=step.usage, next_output_index=step.next_output_index
                )
            tx.emit(*self._take_deltas())
            yield tx
            if self._next_output_index != turn.next_output_index:
                turn = await update_turn(tx.conn, turn.id, next_output_index=self._next_output_index)
            self.turn = turn

    def add_delta(self, payload: dict[str, Any]) -> None:
        """Queue a stream delta for the next write (or the periodic flush)."""
        self._deltas.append(payload)

    @property
    def has_deltas(self) -> bool:
        return bool(self._deltas)

    def _take_deltas(self) -> list[dict[str, Any]]:
        taken, self._deltas = self._deltas, []
        return taken

    # -- history ----------------------------------------------------------------------

    def remember(self, item: ItemRecord) -> None:
        self._history.remember(item)

    def open_calls(self) -> list[ItemRecord]:
        """The turn's tool calls still in progress, oldest first."""
        return self._history.open_calls(self.turn.id)

    def model_input(self) -> list[InputItem]:
        return self._history.model_input()

    async def reload_history(self, tx: Transaction) -> None:
        """Read the session's items again: the client added some (tool results) meanwhile."""
        self._history = History(await session_items(tx.conn, self.session.id))

    # -- items ------------------------------------------------------------------------

    async def _new_item(self, tx: Transaction, type_: str, data: dict[str, Any], **cols: Any) -> ItemRecord:
        output_index = self._next_output_index
        self._next_output_index += 1
        item = await tx.insert_item(
            new_item(
                session_id=self.session.id,
                turn_id=self.turn.id,
                type=type_,
                data=data,
                status=cols.pop("status", ItemStatus.IN_PROGRESS),
                call_id=cols.pop("call_id", None),
                tool_kind=cols.pop("tool_kind", None),
                output_index=output_index,
            )
        )
        self.remember(item)
        return item

    async def _add_message(self, tx: Transaction) -> ItemRecord:
        """Start the assistant's message of this step, with its events."""
        item = await self._new_item(tx, "message", {"role": "assistant", "phase": None, "content": []})
        assert item.output_index is not None
        tx.emit(
            item_event("added", item, item.output_index),
            text_part_event("content_part.added", item, item.output_index, part={"type": "output_text", "text": ""}),
        )
        return item

    async def open_message(self) -> ItemRecord:
        """The model started streaming text: record its message, to which deltas refer."""
        async with self.write() as tx:
            return await self._add_message(tx)

    async def abandon_message(self, message: ItemRecord) -> None:
        """The model attempt that streamed into `message` failed."""
        async with self.write() as tx:
            closed = await tx.transition_item(message, ItemStatus.INCOMPLETE, data=message.data)
            self.remember(closed)
            tx.emit(item_event("done", closed, closed.output_index))

    async def record_step(
        self,
        message: ItemRecord | None,
        response: ModelResponse,
        tools: Sequence[Tool],
        outcomes: Sequence[ToolResult | Hold] | None,
    ) -> list[ItemRecord]:
        """Advance the step, close its message and record its calls (`tools[i]` is the tool
        of `response.tool_calls[i]`), atomically; returns the calls' items.

        With `outcomes` (a step run ahead of its record), a call with a result is stored
        finished, and the stream shows it as if it had run after its record: every call
        added, then each finished one done with its result. A held call stays open.
        """
        calls = response.tool_calls
        opens_message = bool(response.text) and message is None
        done = _StepDone(
            step=self.turn.step + 1,
            usage=_add_usage(self.turn.usage, response.usage),
            next_output_index=self._next_output_index + opens_message + len(calls),
        )
        async with self._transaction(done) as tx:
            if opens_message:
                message = await self._add_message(tx)
                assert message.output_index is not None
                tx.emit(text_part_event("output_text.delta", message, message.output_index, delta=response.text))
            if message is not None:
                self.remember(await self._close_message(tx, message, response))
            finished = [o if isinstance(o, ToolResult) else None for o in outcomes] if outcomes else [None] * len(calls)
            items = [await self._record_call(tx, c, t, r) for c, t, r in zip(calls, tools, finished)]
            for item, result in zip(items, finished):
                if result is not None:
                    for record in await announce_result(tx, item, result):
                        self.remember(record)
        return items

    async def _close_message(self, tx: Transaction, message: ItemRecord, response: ModelResponse) -> ItemRecord:
        text = response.text or ""
        part = {"type": "output_text", "text": text, "annotations": []}
        phase = "commentary" if response.tool_calls else "final_answer"
        closed = await tx.transition_item(
            message, ItemStatus.COMPLETED, data={"role": "assistant", "phase": phase, "content": [part]}
        )
        index = closed.output_index
        assert index is not None
        tx.emit(
            text_part_event("output_text.done", closed, index, text=text),
            text_part_event("content_part.done", closed, index, part=part),
            item_event("done", closed, index),
        )
        return closed

    async def _record_call(self, tx: Transaction, call: ToolCall, tool: Tool, finished: ToolResult | None) -> ItemRecord:
        """Record a call as started, or already `finished` with that result (announced as started)."""
        type_, data = tool.call_item(call)
        status, stored = (ItemStatus.IN_PROGRESS, data) if finished is None else finished_call(type_, data, finished)
        item = await self._new_item(tx, type_, stored, call_id=call.call_id, tool_kind=tool.kind, status=status)
        started = item if finished is None else dataclasses.replace(item, status=ItemStatus.IN_PROGRESS, data=data)
        tx.emit(item_event("added", started, item.output_index))
        if tool.kind == "client":
            # Handed to the client as it is: its content is final.
            tx.emit(item_event("done", item, item.output_index))
        return item


def _add_usage(total: Mapping[str, Any] | None, step: Usage) -> dict[str, int]:
    base = dict(total or {})
    return {
        "input_tokens": int(base.get("input_tokens", 0)) + step.input_tokens,
        "output_tokens": int(base.get("output_tokens", 0)) + step.output_tokens,
        "cached_tokens": int(base.get("cached_tokens", 0)) + step.cached_tokens,
        "reasoning_tokens": int(base.get("reasoning_tokens", 0)) + step.reasoning_tokens,
    }
