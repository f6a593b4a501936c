"""Measures the local model on this machine: join/verify, load, prompt and generation speed.

    .venv/bin/python benchmarks/local_speed.py

Prints the numbers recorded in docs/local-model.md, with the reply grammar on, as the
provider runs; once with a cold prompt and once with a prefix the KV cache already holds.
Needs the `local` extra (`scripts/bootstrap local`).
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

from cairn.models.base import MessageInput, ModelRequest, ToolSpec
from cairn.models.local._prompt import render_prompt
from cairn.models.local._reply import reply_schema
from cairn.models.local._runtime import GenerationSettings, load_model
from cairn.models.local._weights import CATALOGUE, materialize_weights

SHELL = ToolSpec(
    "shell",
    "Run a shell command in the workspace.",
    {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "workspace",
)
ASK = "Write a short essay about directory trees, as the final answer."


def main() -> None:
    cache = Path(".cairn/models")
    started = time.monotonic()
    path = materialize_weights(CATALOGUE["qwen2.5-coder-1.5b"], cache)
    print(f"materialize (join or verify): {time.monotonic() - started:.1f} s")
    model = load_model(path)
    print(f"load: {model.load_seconds:.1f} s, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    request = ModelRequest("speed", "t", 1, 0, "local:x", None, [MessageInput("user", ASK)], [SHELL])
    prompt = render_prompt(request)
    schema = json.dumps(reply_schema([SHELL], allow_tools=False))
    for label in ("cold prompt", "warm prompt"):
        # The second run shares the prompt's prefix, as a turn's later steps do.
        text = prompt.replace(ASK, ASK + (" Be brief." if label == "warm prompt" else ""))
        generation = model.open(text, schema, GenerationSettings(max_tokens=200))
        opened = time.monotonic()
        first = generation.next_piece()
        first_at = time.monotonic()
        while generation.next_piece() is not None:
            pass
        done = time.monotonic()
        generated = generation.output_tokens - 1
        print(
            f"{label}: prompt {generation.prompt_tokens} tokens in {first_at - opened:.1f} s "
            f"({generation.prompt_tokens / (first_at - opened):.0f} tokens/s incl. first token); "
            f"generation {generated} tokens in {done - first_at:.1f} s "
            f"({generated / (done - first_at):.1f} tokens/s); first piece {first!r}"
        )


if __name__ == "__main__":
    main()
