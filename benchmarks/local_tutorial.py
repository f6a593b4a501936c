"""Runs the tree.py tutorial's two turns on the local model, without the server.

A faster loop than `cairn demo` for measuring the local provider's completion rate (the
provider itself is frozen, docs/local-model.md): it drives `LocalModel` through the demo's
two prompts and instructions (`cairn.demo`), with Cairn's own workspace tools
(`cairn.engine.tools`) and sandbox backend, in a fresh temporary workspace per run holding
the demo's sample project, and reports per turn: wall time, the
tool calls made, and whether the turn did what was asked (judged like the demo, plus: each
turn must have run the script itself; the delivered script is run in the sandbox on a
known tree and must print it and limit its depth, `cairn.demo.check_tree_script`).
Every call is printed with its full arguments, for reading the failures afterwards.

    .venv/bin/python benchmarks/local_tutorial.py --runs 5

It needs the `local` extra (`scripts/bootstrap local`). The agent loop here is a minimal
stand-in for the engine's (no store, no approvals): call the model, run its calls, feed
the outputs back, until it answers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from cairn.demo import INSTRUCTIONS, PROMPTS, SAMPLE_PROJECT, check_tree_script
from cairn.engine.tools import run_file_tool, workspace_tool_specs
from cairn.engine.workspace_files import WorkspaceFiles
from cairn.errors import CairnError
from cairn.models.base import (
    FunctionCallInput,
    FunctionCallOutputInput,
    InputItem,
    MessageInput,
    Model,
    ModelRequest,
    ModelResponse,
    TextDelta,
)
from cairn.models.local import create_local_model
from cairn.sandbox.base import ExecRequest, SandboxBackend
from cairn.sandbox.selection import select_backend

MAX_STEPS = 12


@dataclass
class TurnRecord:
    seconds: float = 0.0
    calls: list[str] = field(default_factory=list)
    answer: str = ""
    ok: bool = False
    note: str = ""


async def _run_call(name: str, arguments: dict[str, Any], workspace: Path, backend: SandboxBackend) -> str:
    if name == "shell":
        chunks: list[bytes] = []

        async def sink(data: bytes) -> None:
            chunks.append(data)

        result = await backend.exec(ExecRequest(str(arguments.get("command", "")), workspace, timeout_s=60), sink)
        return f"exit_code: {result.exit_code}\n{b''.join(chunks).decode(errors='replace')}"
    try:
        return await run_file_tool(name, arguments, WorkspaceFiles(workspace, backend.file_owner))
    except CairnError as exc:
        return f"error: {exc}"


async def _turn(
    model: Model, items: list[InputItem], text: str, session: str, ordinal: int, workspace: Path, backend: SandboxBackend
) -> TurnRecord:
    record = TurnRecord()
    items.append(MessageInput("user", text))
    started = time.monotonic()
    print(f"\n>>> user: {text}", flush=True)
    for step in range(MAX_STEPS):
        request = ModelRequest(
            session, f"{session}-t{ordinal}", ordinal, step, "local:qwen2.5-coder-1.5b",
            INSTRUCTIONS, list(items), workspace_tool_specs(),
        )
        response: ModelResponse | None = None
        print("... assistant: ", end="", flush=True)
        async for event in model.stream(request):
            if isinstance(event, TextDelta):
                print(event.text, end="", flush=True)
            else:
                response = event
        assert response is not None
        if not response.tool_calls:
            print(flush=True)
            record.answer = response.text or ""
            items.append(MessageInput("assistant", record.answer))
            break
        for call in response.tool_calls:
            arguments = dict(call.arguments)
            shown = arguments.get("command") or arguments.get("path") or ""
            record.calls.append(f"{call.name}({shown})")
            print(f"[{call.name}] {json.dumps(arguments)}", flush=True)
            output = await _run_call(call.name, arguments, workspace, backend)
            print(f"[output] {output[:400]}", flush=True)
            items.append(FunctionCallInput(call.call_id, call.name, json.dumps(arguments)))
            items.append(FunctionCallOutputInput(call.call_id, output))
    else:
        record.note = f"no answer after {MAX_STEPS} steps"
    record.seconds = time.monotonic() - started
    return record


def _ran(record: TurnRecord, *needles: str) -> bool:
    return any(c.startswith("shell(") and all(n in c for n in needles) for c in record.calls)


async def _judge(first: TurnRecord, second: TurnRecord, workspace: Path) -> None:
    script = workspace / "tree.py"
    first.ok = script.exists() and _ran(first, "tree.py") and bool(first.answer) and not first.note
    if not first.ok:
        first.note = first.note or "tree.py not created and run"
    delivered = workspace / "outputs" / "tree.py"
    problems = []
    if not _ran(second, "tree.py", "--max-depth"):
        problems.append("did not run tree.py --max-depth")
    if not delivered.exists():
        problems.append("outputs/tree.py missing")
    else:
        depth = await check_tree_script(delivered)
        if depth:
            problems.append(depth)
    if second.note:
        problems.append(second.note)
    second.ok = not problems
    # Not part of the verdict (the demo judges the delivered file), but worth knowing.
    if delivered.exists() and (not script.exists() or delivered.read_bytes() != script.read_bytes()):
        problems.append("(outputs/tree.py differs from tree.py)")
    second.note = "; ".join(problems)


async def _run(index: int, cache_dir: Path, backend: SandboxBackend) -> tuple[TurnRecord, TurnRecord]:
    model = create_local_model("local:qwen2.5-coder-1.5b", cache_dir)
    workspace = Path(tempfile.mkdtemp(prefix="cairn-tutorial-"))
    try:
        files = WorkspaceFiles(workspace, backend.file_owner)
        for path, text in SAMPLE_PROJECT.items():
            files.write_bytes(path, text.encode())
        await backend.prepare_workspace(workspace)
        items: list[InputItem] = []
        session = f"tutorial-run-{index}"
        first = await _turn(model, items, PROMPTS[0], session, 1, workspace, backend)
        second = await _turn(model, items, PROMPTS[1], session, 2, workspace, backend)
        await _judge(first, second, workspace)
        return first, second
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--first-run", type=int, default=1, help="index of the first run (varies the seeds)")
    parser.add_argument("--cache-dir", type=Path, default=Path(".cairn/models"))
    args = parser.parse_args()
    backend = select_backend(None)
    rows = []
    for index in range(args.first_run, args.first_run + args.runs):
        print(f"\n===== run {index} =====", flush=True)
        first, second = await _run(index, args.cache_dir, backend)
        rows.append((index, first, second))
    print("\n| run | turn 1 (s) | turn 1 calls | turn 2 (s) | turn 2 calls | outcome |")
    print("|---|---|---|---|---|---|")
    for index, first, second in rows:
        outcome = "both turns completed" if first.ok and second.ok else f"FAILED: {first.note or ''} {second.note or ''}".strip()
        print(
            f"| {index} | {first.seconds:.0f} | {', '.join(first.calls)} | {second.seconds:.0f} | "
            f"{', '.join(second.calls)} | {outcome} |"
        )
    passed = sum(1 for _, a, b in rows if a.ok and b.ok)
    print(f"\n{passed} of {len(rows)} runs completed both turns")


if __name__ == "__main__":
    anyio.run(main)
