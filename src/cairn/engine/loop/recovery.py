"""What a dead worker left open: closed, or run again where that is safe.

A worker that died (or lost its lease) mid-turn may have left the step's assistant message
and some calls in progress. A call it left open cannot be known to have run or not, so it
is closed as `incomplete` and the model is told, unless the pipeline vouches that running
it again cannot repeat an effect (`Pipeline.may_rerun`: the tool only reads, the gate still
holds the call, or a reservation covers it); such a call stays open and goes through the
pipeline again. A client call stays open too: running it is the client's part, and handing
it over again is harmless.

A turn resumed after it waited has nothing to recover: its worker ended the job with every
call finished or held.
"""

from __future__ import annotations

from collections.abc import Callable

from cairn.engine.journal import Transaction
from cairn.engine.lifecycle import add_call_output, close_open_item
from cairn.engine.tools.pipeline import CallInFlight, Pipeline
from cairn.store.items import ItemRecord, turn_items
from cairn.store.turns import TurnRecord

__all__ = ["INTERRUPTED", "recover_open_items"]

INTERRUPTED = "interrupted: Cairn stopped while this call ran; it may or may not have taken effect"


async def recover_open_items(
    tx: Transaction, turn: TurnRecord, pipeline: Pipeline, in_flight: Callable[[ItemRecord], CallInFlight]
) -> list[ItemRecord]:
    """Close what the turn's last worker left open and cannot run again; returns the records
    written."""
    written = []
    for item in await turn_items(tx.conn, turn.id):
        if item.status != "in_progress" or item.tool_kind == "client":
            continue
        if item.call_id is not None and await pipeline.may_rerun(in_flight(item)):
            continue
        closed = await close_open_item(tx, item, INTERRUPTED)
        written.append(closed)
        if closed.type == "function_call":
            written.append(await add_call_output(tx, closed, output=None, error=INTERRUPTED))
    return written
