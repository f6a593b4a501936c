"""Approvals (issue 15): approve → tool start, and listing pending approvals.

Not part of the test run. Three figures, each printed with p50 and p99:

- `cairn`: the latency from sending `POST /v1/approvals/{id}/approve` to the start of the
  approved operator tool, with the API server (`cairn serve --workers 0`) and the worker
  (`cairn worker`) in separate processes, as deployed; the tool notes the time it starts in
  a file. On SQLite (one data dir) and on a throwaway PostgreSQL.
- `sdk`: the OpenAI Agents SDK 0.24's own way in the same run: `RunState.from_json` of a paused
  run + `state.approve(...)` + `Runner.run(agent, state)` until the approved tool starts, in one
  process and in memory (nothing durable, no checks).
- `list`: `GET /v1/approvals?status=pending&tool_name=…` (and `&session_id=…`) over HTTP with
  10,000 pending approvals in the tenant, 20 per page.

Targets (issue 15): approve → tool start p50 under 25 ms on SQLite and 50 ms on PostgreSQL;
listing under 50 ms.

Usage: .venv/bin/python benchmarks/approvals.py [--samples 30] [--pending 10000] [--postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx

from cairn.ids import new_approval_id, new_session_id, new_turn_id
from cairn.states import ApprovalStatus
from cairn.store.approvals import ApprovalRecord, insert_approval
from cairn.store.db import Database
from cairn.testing.postgres import ThrowawayPostgres
from cairn.testing.server import CairnServer, CairnWorker

HERE = Path(__file__).parent
AGENTS = "approval_bench_agents:registry"


def _percentiles(label: str, values_ms: list[float], target_ms: float | None = None) -> None:
    ordered = sorted(values_ms)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    target = f"   (target p50 < {target_ms:.0f} ms: {'met' if p50 < target_ms else 'NOT met'})" if target_ms else ""
    print(f"{label:<58} p50 {p50:8.2f} ms   p99 {p99:8.2f} ms   n={len(ordered)}{target}", flush=True)


@contextmanager
def _deployment(database_url: str | None, *, worker: bool = True) -> Iterator[tuple[CairnServer, Path]]:
    """An API server without workers and, with `worker`, one `cairn worker` beside it."""
    root = Path(tempfile.mkdtemp(prefix="cairn-bench-approvals-"))
    os.chmod(root, 0o711)
    scripts = root / "scripts"
    scripts.mkdir()
    (scripts / "deploy.json").write_text(json.dumps({"turns": [[{"call": "deploy", "arguments": {"release": "r-1"}}, {"say": "done"}]]}))
    starts = root / "starts.log"
    env = {"PYTHONPATH": str(HERE), "CAIRN_BENCH_STARTS": str(starts)}
    agents = ("--agents", AGENTS) if worker else ()
    api = CairnServer(root / "data", scripts_dir=scripts, database_url=database_url, env=env,
                      extra_args=("--workers", "0", *agents)).start()
    workers = [CairnWorker(api.data_dir, scripts_dir=scripts, database_url=database_url, env=env,
                           extra_args=("--workers", "2", *agents)).start()] if worker else []
    try:
        yield api, starts
    finally:
        for process in workers:
            process.stop()
        api.stop()
        shutil.rmtree(root)


def _wait(condition: Callable[[], Any], what: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.001)
    raise RuntimeError(f"timed out waiting for {what}")


def cairn_approve_to_start(database_url: str | None, samples: int) -> list[float]:
    """Milliseconds from sending the approval to the tool's start, per sample."""
    latencies = []
    with _deployment(database_url) as (api, starts):
        http = httpx.Client(base_url=api.base_url, headers={"Authorization": f"Bearer {api.admin_key}"}, timeout=30)
        for _ in range(samples):
            created = http.post("/agents/sessions", json={"agent_id": "bench-agent", "agent": {"model": "scripted:deploy"},
                                                          "environment": {"type": "none"}, "input": "go"}).json()
            session_id = created["id"]

            def held(session_id: str = session_id) -> Any:
                session = http.get(f"/agents/sessions/{session_id}").json()
                return session["status"] == "requires_action" and session["required_actions"]

            [action] = _wait(held, "the call to be held")
            approval = http.get(f"/approvals/{action['request_id']}").json()
            seen = len(starts.read_text().splitlines()) if starts.exists() else 0
            sent = time.time()
            response = http.post(f"/approvals/{approval['id']}/approve", json={"arguments_digest": approval["arguments_digest"]})
            assert response.status_code == 200, response.text
            def started(seen: int = seen) -> list[str] | None:
                lines = starts.read_text().splitlines() if starts.exists() else []
                return lines if len(lines) > seen else None

            lines = _wait(started, "the tool to start")
            latencies.append((float(lines[-1]) - sent) * 1000)
            def ended(session_id: str = session_id) -> bool:
                return bool(http.get(f"/agents/sessions/{session_id}").json()["status"] == "idle")

            _wait(ended, "the turn to end")
        http.close()
    return latencies


async def sdk_approve_to_start(samples: int) -> list[float]:
    """The Agents SDK: from a stored paused run to the approved tool's start, per sample."""
    from agents import Agent, RunConfig, Runner, RunState, function_tool
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    started: list[float] = []

    @function_tool(needs_approval=True)
    def deploy(release: str) -> str:
        """Deploy a release."""
        started.append(time.perf_counter())
        return f"deployed:{release}"

    class Scripted(Model):
        """Calls `deploy` the first time it is asked (the run that pauses), answers after."""

        def __init__(self) -> None:
            self.asked = 0

        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            self.asked += 1
            if self.asked == 1:
                output: list[Any] = [ResponseFunctionToolCall(type="function_call", id="fc_1", call_id="call_1", name="deploy",
                                                              arguments='{"release": "r-1"}', status="completed")]
            else:
                output = [ResponseOutputMessage(id="msg_1", type="message", role="assistant", status="completed",
                                                content=[ResponseOutputText(type="output_text", text="done", annotations=[])])]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    agent = Agent(name="bench", model=Scripted(), tools=[deploy])
    config = RunConfig(tracing_disabled=True)
    paused = await Runner.run(agent, "go", run_config=config)
    assert paused.interruptions, "the SDK run did not pause for approval"
    stored = json.dumps(paused.to_state().to_json())
    latencies = []
    for _ in range(samples):
        started.clear()
        begin = time.perf_counter()
        state = await RunState.from_json(agent, json.loads(stored))
        for interruption in state.get_interruptions():
            state.approve(interruption)
        await Runner.run(agent, state, run_config=config)
        assert started, "the approved SDK tool did not run"
        latencies.append((started[0] - begin) * 1000)
    return latencies


async def _fill(database_url: str, pending: int) -> tuple[str, str]:
    """`pending` approvals of the default tenant over 100 sessions and two tools; returns a
    session id and the rarer tool's name to filter on."""
    db = Database(database_url)
    sessions = [new_session_id() for _ in range(100)]
    try:
        for start in range(0, pending, 500):
            async with db.write() as conn:
                for i in range(start, min(pending, start + 500)):
                    tool = "rollback" if i % 10 == 0 else "deploy"
                    record = ApprovalRecord(
                        id=new_approval_id(), tenant="default", session_id=sessions[i % 100], turn_id=new_turn_id(),
                        call_id=f"call_{i}", tool_name=tool, review={"release": f"r-{i}"}, summary=f"{tool}(release='r-{i}')",
                        arguments_digest=secrets.token_hex(32), agent_version="bench-agent/v1", agent_revision="rev",
                        approvers=["admin", "approver"], run_state={"call_id": f"call_{i}"}, run_state_version=1,
                        status=ApprovalStatus.PENDING, reason=None, message=None, created_at=0.0, expires_at=0.0,
                    )
                    await insert_approval(conn, record, ttl_s=86400)
    finally:
        await db.dispose()
    return sessions[0], "rollback"


def listing(database_url: str | None, pending: int, requests: int) -> dict[str, list[float]]:
    with _deployment(database_url, worker=False) as (api, _):
        url = database_url or f"sqlite:///{api.data_dir / 'cairn.db'}"
        session_id, tool = anyio.run(_fill, url, pending)
        http = httpx.Client(base_url=api.base_url, headers={"Authorization": f"Bearer {api.admin_key}"}, timeout=30)
        figures: dict[str, list[float]] = {}
        for label, params in (("status=pending&tool_name", {"status": "pending", "tool_name": tool}),
                              ("status=pending&session_id", {"status": "pending", "session_id": session_id})):
            times = []
            for _ in range(requests):
                begin = time.perf_counter()
                response = http.get("/approvals", params={**params, "limit": "20"})
                times.append((time.perf_counter() - begin) * 1000)
                assert response.status_code == 200 and response.json()["data"], response.text
            figures[label] = times
        http.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--postgres", action="store_true", help="also measure on a throwaway PostgreSQL")
    parser.add_argument("--skip-cairn", action="store_true", help="only the SDK and the listing")
    args = parser.parse_args()
    print(f"{args.samples} approvals per figure, {args.pending} pending for the listing, on {os.cpu_count()} cores\n")
    _percentiles("Agents SDK: from_json + approve + Runner.run → tool start", anyio.run(sdk_approve_to_start, args.samples))
    if not args.skip_cairn:
        _percentiles("Cairn, SQLite, separate worker", cairn_approve_to_start(None, args.samples), 25)
    for label, times in listing(None, args.pending, args.requests).items():
        _percentiles(f"Cairn, SQLite, list {args.pending} pending: {label}", times, 50)
    if args.postgres:
        with ThrowawayPostgres() as server:
            if not args.skip_cairn:
                _percentiles("Cairn, PostgreSQL, separate worker",
                             cairn_approve_to_start(server.create_database("bench_approve"), args.samples), 50)
            for label, times in listing(server.create_database("bench_list"), args.pending, args.requests).items():
                _percentiles(f"Cairn, PostgreSQL, list {args.pending} pending: {label}", times, 50)


if __name__ == "__main__":
    main()
