"""Spots a small model repeating itself within a turn, so the provider can steer it away.

Measured: without a guard, Qwen2.5-Coder-1.5B re-issues the command it just ran, reads
the same output, and issues it again until the turn's step budget runs out. Re-running a
command is sometimes right (run, fix the file, run again), so a call counts as a repeat
only if it is identical to the *previous* call of the turn (nothing happened in between
that could change its result) or if the turn already made it twice (an A-B-A-B loop).
A turn with very many calls is also told to finish; that limit is a backstop well above
what the tutorial tasks need.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cairn.models.base import FunctionCallInput, InputItem, MessageInput

__all__ = ["CallKey", "TurnCalls", "call_key", "turn_calls"]

CallKey = tuple[str, str]


def _canonical(value: Any) -> Any:
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, Mapping):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def call_key(name: str, arguments: Mapping[str, Any] | str) -> CallKey:
    """Identity of a call for repeat detection: whitespace and key order do not matter."""
    value: Any = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError:
            return (name, " ".join(arguments.split()))
    return (name, json.dumps(_canonical(value), sort_keys=True, ensure_ascii=False))


@dataclass(frozen=True, slots=True)
class TurnCalls:
    """The calls made so far in the current turn, oldest first."""

    keys: tuple[CallKey, ...]

    def is_repeat(self, key: CallKey) -> bool:
        if self.keys and self.keys[-1] == key:
            return True
        return self.keys.count(key) >= 2

    def __len__(self) -> int:
        return len(self.keys)


def turn_calls(items: Sequence[InputItem]) -> TurnCalls:
    """Collect the calls after the last user message, which is where the turn began."""
    start = 0
    for index, item in enumerate(items):
        if isinstance(item, MessageInput) and item.role == "user":
            start = index + 1
    keys = tuple(
        call_key(item.name, item.arguments)
        for item in items[start:]
        if isinstance(item, FunctionCallInput)
    )
    return TurnCalls(keys)
