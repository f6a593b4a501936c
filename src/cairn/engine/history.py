"""The session's items as the worker running a turn knows them.

Loaded once per job and kept current by the worker's own writes, so a step costs the same
whether it is the first or the hundredth: items are found by id, the open calls are
tracked as they change, and each item's model input is converted once per version of the
item (records are immutable, so a replaced record is a changed item).
"""

from __future__ import annotations

from collections.abc import Iterable

from cairn.engine.model_input import item_input
from cairn.models.base import InputItem
from cairn.store.items import ItemRecord

__all__ = ["History"]


class History:
    def __init__(self, items: Iterable[ItemRecord] = ()) -> None:
        self._items: list[ItemRecord] = []
        self._positions: dict[str, int] = {}
        self._open: dict[str, ItemRecord] = {}
        self._inputs: dict[str, tuple[ItemRecord, list[InputItem]]] = {}
        for item in items:
            self.remember(item)

    def remember(self, item: ItemRecord) -> None:
        """Add a new item, or replace the stored version of a known one."""
        position = self._positions.get(item.id)
        if position is None:
            self._positions[item.id] = len(self._items)
            self._items.append(item)
        else:
            self._items[position] = item
        if item.status == "in_progress":
            self._open[item.id] = item
        else:
            self._open.pop(item.id, None)

    def open_calls(self, turn_id: str, tool_kind: str) -> list[ItemRecord]:
        """The turn's calls of `tool_kind` that are still in progress, oldest first."""
        return [i for i in self._open.values() if i.turn_id == turn_id and i.tool_kind == tool_kind]

    def model_input(self) -> list[InputItem]:
        entries: list[InputItem] = []
        for item in self._items:
            cached = self._inputs.get(item.id)
            if cached is None or cached[0] is not item:
                cached = (item, item_input(item))
                self._inputs[item.id] = cached
            entries.extend(cached[1])
        return entries
