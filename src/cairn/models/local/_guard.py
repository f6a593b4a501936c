"""Spots a small model repeating itself within a turn, so the provider can steer it away.

Measured: without a guard, Qwen2.5-Coder-1.5B re-issues the command it just ran, reads
the same output, and issues it again until the turn's step budget runs out. Re-running a
command is sometimes right (run, fix the file, run again), so a call counts as a repeat
only if it is identical to the *previous* call of the turn (nothing happened in between
that could change its result) or if the turn already made it twice (an A-B-A-B loop).
It also loops with varying arguments: it wrote one numbered file after another (`file2`,
`file3`, … `file14`) under one unchanged thought. So a call that would be the third in a
row with the same tool and the same thought is a repeat too. A turn with very many calls
is also told to finish; that limit is a backstop well above what a small task needs.
Within one reply, `is_looping` spots the same text over and over (seen: a write_file whose
content ran to the token limit), so the reply can be cut short instead of burning minutes
of generation. `SavedFiles` knows what the conversation last saved at each path, so a file
written again unchanged (a repeat with a run in between) can be spotted too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cairn.models.base import FunctionCallInput, InputItem, MessageInput

__all__ = [
    "CallKey",
    "SavedFiles",
    "TurnCalls",
    "call_key",
    "intent_key",
    "is_looping",
    "turn_calls",
]

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


def intent_key(name: str, thought: str) -> CallKey:
    """What a call means to do: its tool and its thought, whatever its arguments.

    Numbers count as equal, as in `is_looping`: the model also loops by counting in its
    thought (seen: the same command with an option's value counting up, `2`, `3`, … `12`,
    one call each, until the call cap).
    """
    return (name, re.sub(r"\d+", "0", " ".join(thought.lower().split())))


@dataclass(frozen=True, slots=True)
class TurnCalls:
    """The calls made so far in the current turn, oldest first, with their intents."""

    keys: tuple[CallKey, ...]
    intents: tuple[CallKey, ...]

    def is_repeat(self, key: CallKey, intent: CallKey) -> bool:
        if self.keys and self.keys[-1] == key:
            return True
        if self.keys.count(key) >= 2:
            return True
        return bool(intent[1]) and self.intents[-2:] == (intent, intent)

    def __len__(self) -> int:
        return len(self.keys)


def turn_calls(items: Sequence[InputItem]) -> TurnCalls:
    """Collect the calls after the last user message, which is where the turn began.

    A call's thought is the assistant message stored just before it (see `_provider`).
    """
    start = 0
    for index, item in enumerate(items):
        if isinstance(item, MessageInput) and item.role == "user":
            start = index + 1
    keys: list[CallKey] = []
    intents: list[CallKey] = []
    previous: InputItem | None = None
    for item in items[start:]:
        if isinstance(item, FunctionCallInput):
            thought = previous.text if isinstance(previous, MessageInput) and previous.role == "assistant" else ""
            keys.append(call_key(item.name, item.arguments))
            intents.append(intent_key(item.name, thought))
        previous = item
    return TurnCalls(tuple(keys), tuple(intents))


def _file_key(path: str) -> str:
    """A workspace path as written in calls, compared without `/workspace/` or `./`."""
    return path.strip().removeprefix("/workspace/").removeprefix("./")


class SavedFiles:
    """The content the conversation's calls last saved at each path. A saving call has a
    string `path` and a string `content` (whatever the tool's name)."""

    def __init__(self, items: Iterable[InputItem]) -> None:
        self._files: dict[str, str] = {}  # `_file_key` -> content
        for item in items:
            if not isinstance(item, FunctionCallInput):
                continue
            try:
                arguments = json.loads(item.arguments)
            except json.JSONDecodeError:
                continue
            if isinstance(arguments, dict) and isinstance(arguments.get("path"), str) and isinstance(arguments.get("content"), str):
                self._files[_file_key(arguments["path"])] = arguments["content"]

    def content_of(self, path: str) -> str | None:
        """The content the last call saving `path` gave it, if any call did.

        Measured: after a failed run, the model "fixed" the file by writing the same content
        again, which the repeat guard does not see (a run came in between).
        """
        return self._files.get(_file_key(path))


# A reply whose last _LOOP_SPAN characters repeat a block of at most _LOOP_PERIOD
# characters is stuck; no file or answer the model should write looks like that.
_LOOP_SPAN = 320
_LOOP_PERIOD = 160


def is_looping(text: str) -> bool:
    """Whether `text` ends in the same block repeated over at least _LOOP_SPAN characters.

    Numbers count as equal, because the model also loops by counting: it once listed
    numbered folders, `folder1` … `folder94`, in its answer.
    """
    if len(text) < _LOOP_SPAN:
        return False
    tail = re.sub(r"\d+", "0", text)[-_LOOP_SPAN:]
    for period in range(1, _LOOP_PERIOD + 1):
        if tail[period:] == tail[:-period]:
            return True
    return False
