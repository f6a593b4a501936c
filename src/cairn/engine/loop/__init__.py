"""The agent loop: the runner that drives a turn's steps, the step (one model call and its
tool calls), the recorder that owns the turn's history and writes, waiting and recovery."""

from cairn.engine.loop.runner import TurnRunner
from cairn.engine.loop.waiting import release_hold

__all__ = ["TurnRunner", "release_hold"]
