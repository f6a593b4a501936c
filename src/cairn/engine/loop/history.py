"""The session's items as the worker running a turn knows them.

Loaded once per job and kept current by the worker's own writes, so a step costs the same
whether it is the first or the hundredth: items are found by id, the open calls are
tracked as they change, each item's model input is converted once per version of the
item (records are immutable, so a replaced record is a changed item), and the model input
as a whole is kept up to date as items are added, rebuilt only when a replaced item's
conversion differs.
"""

from __future__ import annotations

from collections.abc import Iterable

from cairn.engine.loop.model_input import item_input
from cairn.models.base import InputItem
from cairn.store.items import ItemRecord

__all__ = ["History"]


class History:
    def __init__(self, items: Iterable[ItemRecord] = ()) -> None:
        self._records: dict[str, ItemRecord] = {}
        self._positions: dict[str, int] = {}
        self._inputs: list[list[InputItem]] = []  # each item's model input, in append order
        self._model_input: list[InputItem] | None = []  # their concatenation; None: to be rebuilt
        self._open: dict[str, ItemRecord] = {}
        for item in items:
            self.remember(item)

    def remember(self, item: ItemRecord) -> None:
        """Add a new item, or replace the stored version of a known one."""
        if self._records.get(item.id) is item:
            return
        self._records[item.id] = item
        entries = item_input(item)
        position = self._positions.get(item.id)
        if position is None:
            self._positions[item.id] = len(self._inputs)
            self._inputs.append(entries)
            if self._model_input is not None:
                self._model_input.extend(entries)
        elif entries != self._inputs[position]:
            self._inputs[position] = entries
            self._model_input = None
        if item.status == "in_progress":
            self._open[item.id] = item
        else:
            self._open.pop(item.id, None)

    def open_calls(self, turn_id: str) -> list[ItemRecord]:
        """The turn's tool calls that are still in progress, oldest first."""
        return [i for i in self._open.values() if i.turn_id == turn_id and i.call_id is not None]

    def model_input(self) -> list[InputItem]:
        """The model's input for the next step (a copy the caller may keep)."""
        if self._model_input is None:
            self._model_input = [entry for entries in self._inputs for entry in entries]
        return list(self._model_input)
