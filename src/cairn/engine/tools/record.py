"""The `record` stage: a call's result becomes the end of its item, stored once with its events.

A `command_execution` item carries its own result (output, exit code, duration), and so does
an `mcp_call` (a call recorded for an approval: `output` or `error`, and a command's exit code
and duration when it ran one); a `function_call` is marked done and followed by a
`function_call_output` item. The write
goes through the turn's writer, which fences it by the job's lease token, so a worker that
lost its lease records nothing; what a stage claimed for the call (its `Settlement`: the
ledger's entry) is settled in that same transaction. A read-only step stores its calls already finished in the
step's own transaction (`cairn.engine.loop.recorder`), with the same content and events,
built by the functions below.
"""

from __future__ import annotations

import abc
from contextlib import AbstractAsyncContextManager
from typing import Any

from cairn.engine.events import item_event
from cairn.engine.journal import Transaction
from cairn.engine.lifecycle import add_call_output
from cairn.engine.tools.base import CommandResult, ToolResult
from cairn.engine.tools.pipeline import CallInFlight, ResultRecorder
from cairn.errors import CairnMisuseError
from cairn.states import ItemStatus
from cairn.store.items import ItemRecord

__all__ = ["RecordStage", "TurnWriter", "announce_result", "finished_call"]


class TurnWriter(abc.ABC):
    """The running turn's way to write: fenced transactions and the history they change."""

    @abc.abstractmethod
    def write(self) -> AbstractAsyncContextManager[Transaction]:
        """A journal transaction fenced by the job's lease token."""

    @abc.abstractmethod
    def remember(self, item: ItemRecord) -> None:
        """Keep the turn's history current with an item this process wrote."""


# Item types that carry their call's result themselves, with no output item after them.
_SELF_CONTAINED = frozenset({"command_execution", "mcp_call"})


def finished_call(item_type: str, data: dict[str, Any], result: ToolResult) -> tuple[ItemStatus, dict[str, Any]]:
    """The status and content of a call's item once `result` ended it."""
    if item_type == "mcp_call":
        ended = {**data, "output": result.output if result.error is None else None, "error": result.error}
        if isinstance(result, CommandResult):
            ended.update(exit_code=result.exit_code, duration_ms=result.duration_ms)
        return result.status, ended
    if item_type != "command_execution":
        return result.status, data
    command = result if isinstance(result, CommandResult) else CommandResult(error=result.error)
    shown = command.output if command.error is None else command.error
    return command.status, {**data, "output": shown, "exit_code": command.exit_code, "duration_ms": command.duration_ms}


async def announce_result(tx: Transaction, item: ItemRecord, result: ToolResult) -> list[ItemRecord]:
    """Emit that the finished call `item` is done and store its output item if it has one;
    returns the records written."""
    tx.emit(item_event("done", item, item.output_index))
    if item.type in _SELF_CONTAINED:
        return [item]
    return [item, await add_call_output(tx, item, output=result.output, error=result.error)]


class RecordStage(ResultRecorder):
    def __init__(self, writer: TurnWriter) -> None:
        self._writer = writer

    async def record(self, call: CallInFlight, result: ToolResult) -> None:
        item = call.item
        if item is None:
            raise CairnMisuseError(f"call {call.call.call_id} must be recorded before its result")
        settlement = call.settlement
        fields = settlement.item_fields if settlement is not None else {}
        status, data = finished_call(item.type, {**item.data, **fields}, result)
        async with self._writer.write() as tx:
            if settlement is not None:
                # In the same fenced transaction: the claim is settled if and only if the
                # result is recorded.
                await settlement.settle(tx, result)
            done = await tx.transition_item(item, status, data=data)
            for record in await announce_result(tx, done, result):
                self._writer.remember(record)
