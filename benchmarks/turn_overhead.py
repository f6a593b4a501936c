"""Per-tool-step overhead of the agent loop: Cairn vs the OpenAI Agents SDK's Runner.

Both run one turn of N steps on a scripted model; each step calls a tool that reads a small
file (or, with `--tool write_file`, writes one), then the model answers. The model and the
tool cost next to nothing, so the time per step is the loop's own overhead. Cairn's figure
includes its durable writes (items, events, run state, all committed to SQLite or
PostgreSQL before the next step); the SDK is measured in memory and with its SQLiteSession
(its durable option).

    .venv/bin/python benchmarks/turn_overhead.py [--steps 100] [--repeats 5] [--tool read_file] [--postgres]

Target (issue 2, on the default read_file steps): Cairn's per-step time at most one fifth of
the SDK's. A read-only step is Cairn's cheapest (one transaction: the call, needing no record
before it runs, is stored with its result); a write_file step shows the general case (the call
is recorded before it runs, its result after). Prints medians.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio

from cairn.bootstrap import build_runtime
from cairn.config import Settings
from cairn.engine.loop import TurnRunner
from cairn.engine.sessions import SessionService
from cairn.store.db import Database
from cairn.store.jobs import claim_job
from cairn.store.migrate import upgrade
from cairn.testing.postgres import ThrowawayPostgres

NOTE = "a small file the tool reads\n"
# The workspace is made, with its inline files, by the worker that first runs a turn.
NOTE_ENVIRONMENT = {
    "type": "openai_hosted",
    "files": [{"type": "inline", "data": base64.b64encode(NOTE.encode()).decode(), "path": "/workspace/note.txt"}],
}
ARGUMENTS = {"read_file": {"path": "note.txt"}, "write_file": {"path": "out.txt", "content": NOTE}}


async def cairn_turn(steps: int, tool: str, root: Path, database_url: str | None) -> float:
    """Seconds for one turn of `steps` tool steps, durable writes included."""
    scripts = root / "scripts"
    scripts.mkdir()
    step = {"call": tool, "arguments": ARGUMENTS[tool]}
    (scripts / "bench.json").write_text(json.dumps({"turns": [[step] * steps + [{"say": "done"}]]}))
    settings = Settings(data_dir=root / "data", scripts_dir=scripts, database_url=database_url)
    settings.data_dir.mkdir()
    db = Database(settings.resolved_database_url)
    await upgrade(db)
    runtime = build_runtime(settings, db)
    service = SessionService(runtime)
    message = {"role": "user", "content": [{"type": "input_text", "text": "go"}]}
    created = await service.create(
        "bench", {"agent": {"model": "scripted:bench"}, "environment": NOTE_ENVIRONMENT, "input": [message]}
    )
    job = await claim_job(db, owner="bench", lease_s=300)
    assert job is not None
    started = time.perf_counter()
    await TurnRunner(runtime).run(job)
    elapsed = time.perf_counter() - started
    turn = (await service.get("bench", created.session.id)).status
    assert turn == "idle", turn
    await db.dispose()
    return elapsed


async def sdk_turn(steps: int, tool: str, root: Path, durable: bool) -> float:
    from agents import Agent, ModelSettings, RunConfig, Runner, SQLiteSession, function_tool
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    workspace = root / "ws"
    workspace.mkdir()
    (workspace / "note.txt").write_text(NOTE)

    @function_tool
    def read_file(path: str) -> str:
        """Read a file of the workspace."""
        return (workspace / path).read_text()

    @function_tool
    def write_file(path: str, content: str) -> str:
        """Write a file of the workspace."""
        data = content.encode()
        (workspace / path).write_bytes(data)
        return f"wrote {len(data)} bytes to /workspace/{path}"

    class ScriptedModel(Model):
        def __init__(self) -> None:
            self.calls = 0

        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            self.calls += 1
            if self.calls <= steps:
                output: list[Any] = [ResponseFunctionToolCall(
                    type="function_call", id=f"fc_{self.calls}", call_id=f"call_{self.calls}", name=tool,
                    arguments=json.dumps(ARGUMENTS[tool]), status="completed",
                )]
            else:
                output = [ResponseOutputMessage(
                    id="msg_1", type="message", role="assistant", status="completed",
                    content=[ResponseOutputText(type="output_text", text="done", annotations=[])],
                )]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            raise NotImplementedError

    tools = {"read_file": read_file, "write_file": write_file}
    agent = Agent(name="bench", model=ScriptedModel(), tools=[tools[tool]], model_settings=ModelSettings())
    session = SQLiteSession("bench", str(root / "sdk.db")) if durable else None
    started = time.perf_counter()
    result = await Runner.run(agent, "go", max_turns=steps + 2, session=session, run_config=RunConfig(tracing_disabled=True))
    elapsed = time.perf_counter() - started
    assert result.final_output == "done"
    return elapsed


def measure(label: str, steps: int, repeats: int, run: Callable[[Path], Coroutine[Any, Any, float]]) -> float:
    per_step = []
    for _ in range(repeats):
        root = Path(tempfile.mkdtemp(prefix="cairn-bench-"))
        os.chmod(root, 0o711)
        try:
            per_step.append(anyio.run(run, root) / steps * 1000)
        finally:
            shutil.rmtree(root)
    median = statistics.median(per_step)
    print(f"{label:<40} {median:8.2f} ms/step   (runs: {', '.join(f'{v:.2f}' for v in per_step)})", flush=True)
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tool", choices=sorted(ARGUMENTS), default="read_file", help="the tool every step calls")
    parser.add_argument("--postgres", action="store_true", help="also measure Cairn on a throwaway PostgreSQL")
    args = parser.parse_args()
    steps, repeats, tool = args.steps, args.repeats, args.tool
    print(f"one turn of {steps} {tool} steps, median of {repeats} runs, on {os.cpu_count()} cores\n")
    sdk = measure("OpenAI Agents SDK Runner (in memory)", steps, repeats, lambda r: sdk_turn(steps, tool, r, durable=False))
    sdk_durable = measure(
        "OpenAI Agents SDK Runner + SQLiteSession", steps, repeats, lambda r: sdk_turn(steps, tool, r, durable=True)
    )
    cairn = measure("Cairn engine, SQLite (durable)", steps, repeats, lambda r: cairn_turn(steps, tool, r, None))
    if args.postgres:
        with ThrowawayPostgres() as server:
            counter = iter(range(1000))
            measure("Cairn engine, PostgreSQL (durable)", steps, repeats,
                    lambda r: cairn_turn(steps, tool, r, server.create_database(f"bench{next(counter)}")))
    print(f"\nCairn / SDK in memory: {cairn / sdk:.2f}   Cairn / SDK + SQLiteSession: {cairn / sdk_durable:.2f}   "
          f"(target: at most 0.20 of the SDK's per-step time)")


if __name__ == "__main__":
    main()
