"""The idempotency ledger across real OS processes (issue 16, design invariant 5): whatever is
delivered twice, replayed, killed or paused, a side effect happens at most once, by the record
the tools keep outside Cairn (`ledger_agents`), and an outcome nobody can know waits for a person.

Every kill point is deterministic: a worker started with `CAIRN_TEST_PAUSE` stops at a named
point (after reserving, or right after the effect), says so in a file, and waits there until
the test kills it (SIGKILL) or pauses it (SIGSTOP). Leases are 2 s, so another worker takes a
dead worker's job over within seconds; every wait is on a state, with a deadline.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cairn.store.tables import approvals, items, jobs, sessions, turns
from cairn.testing.server import CairnWorker
from tests.e2e.conftest import DATABASES, database_url_for
from tests.e2e.deployment import Deployment
from tests.waits import until_blocking

AGENTS = "ledger_agents:registry"


class Ledger(Deployment):
    """A deployment of the ledger agents, with the effects and attempts their tools recorded."""

    def __init__(self, scripts_dir: Path, database_url: str | None, **env: str) -> None:
        root = Path(scripts_dir).parent
        self.paused_path = root / f"paused-{os.getpid()}-{id(self)}"
        self.go_path = root / f"go-{os.getpid()}-{id(self)}"
        super().__init__(scripts_dir, database_url, agents=AGENTS, env={
            "CAIRN_LEASE_S": "2", "CAIRN_LEDGER_RETRY_DELAY_S": "0.1", "CAIRN_TEST_PAUSED": str(self.paused_path),
            "CAIRN_TEST_GO": str(self.go_path), **env,
        })

    def effects(self) -> list[str]:
        """The operation key of every real execution, in order."""
        return [line.split()[0] for line in self.deploys()]

    def attempts(self) -> list[str]:
        path = self.deploys_path.with_suffix(".attempts")
        return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []

    def paused_worker(self, point: str) -> CairnWorker:
        """A worker that stops at `point` (before_executing, after_effect) and waits there."""
        self.paused_path.unlink(missing_ok=True)
        return self.worker(env={"CAIRN_TEST_PAUSE": point})

    def wait_paused(self, worker: CairnWorker) -> None:
        until_blocking(lambda: self.paused_path.exists(), "the worker to reach its pause point", timeout_s=60,
                       seen=worker.log_since_start)
        assert self.paused_path.read_text().split()[0] == str(worker.pid)

    def kill(self, worker: CairnWorker) -> None:
        worker.kill()
        self.workers.remove(worker)

    def entries(self, **params: str) -> list[dict[str, Any]]:
        with self.http() as http:
            return list(http.get("/ledger", params={"limit": "100", "order": "asc", **params}).json()["data"])

    def entry(self) -> dict[str, Any]:
        found = self.entries()
        assert len(found) == 1, found
        return found[0]

    def call(self, session_id: str) -> dict[str, Any]:
        """The session's one tool call item (an `mcp_call`, or a `function_call` with its output's result)."""
        found = self.items(session_id)
        [call] = [i for i in found if i["type"] in ("mcp_call", "function_call")]
        for output in (i for i in found if i["type"] == "function_call_output"):
            call = {**call, "output": output.get("output"), "error": output.get("error")}
        return call


@pytest.fixture
def ledger(scripts_dir: Path) -> Iterator[Ledger]:
    instance = Ledger(scripts_dir, None)
    try:
        yield instance
    finally:
        instance.close()


def _rows(conn: sa.Connection, table: sa.Table, *where: sa.ColumnElement[bool]) -> list[dict[str, Any]]:
    return [dict(row._mapping) for row in conn.execute(sa.select(table).where(*where))]


def _put_back(conn: sa.Connection, table: sa.Table, key: sa.Column[Any], rows: list[dict[str, Any]]) -> None:
    for row in rows:
        conn.execute(sa.update(table).where(key == row[key.name]).values(**row))


# -- delivered twice, replayed ------------------------------------------------------------------


@pytest.mark.parametrize("database", DATABASES)
def test_the_resume_delivered_twice_at_once_and_then_replayed_deploys_once_and_reuses_once(
    request: pytest.FixtureRequest, scripts_dir: Path, database: str
) -> None:
    deployment = Ledger(scripts_dir, database_url_for(request, database, "ledger"))
    try:
        deployment.worker()
        session_id, [action] = deployment.held("scripted:ledger_deploy_release")
        deployment.stop_workers()
        deployment.approve(action["request_id"])
        engine = deployment.engine()
        with engine.begin() as conn:
            # The approved state, as a run state would hold it: the turn, its open call, the approval.
            turn_id = action["turn_id"]
            approved = {
                "turn": _rows(conn, turns, turns.c.id == turn_id),
                "call": _rows(conn, items, items.c.turn_id == turn_id, items.c.type == "mcp_call"),
                "approval": _rows(conn, approvals, approvals.c.id == action["request_id"]),
            }
            # The resume job delivered twice: a second copy of it in the queue.
            [queued] = _rows(conn, jobs, jobs.c.turn_id == turn_id, jobs.c.status == "queued")
            conn.execute(sa.insert(jobs).values(kind=queued["kind"], session_id=session_id, turn_id=turn_id, status="queued",
                                                created_at=queued["created_at"]))

        # Both deliveries to two worker processes, started at once.
        starting = [threading.Thread(target=deployment.worker) for _ in range(2)]
        for thread in starting:
            thread.start()
        for thread in starting:
            thread.join(timeout=120)
        deployment.turn_done(session_id)
        until_blocking(lambda: _job_statuses(engine, turn_id) == ["done", "done", "done"], "both deliveries to be done",
                       timeout_s=60, seen=lambda: _job_statuses(engine, turn_id))
        [key] = deployment.effects()
        assert deployment.entry()["operation_key"] == key and deployment.entry()["approval_id"] == action["request_id"]

        # The same approved state replayed to a worker, as the SDK's RunState can be.
        with engine.begin() as conn:
            [call] = approved["call"]
            conn.execute(sa.delete(items).where(items.c.turn_id == turn_id, items.c.position > call["position"]))
            for table, key_column, rows in ((turns, turns.c.id, approved["turn"]), (items, items.c.id, approved["call"]),
                                            (approvals, approvals.c.id, approved["approval"])):
                _put_back(conn, table, key_column, rows)
            # The session's own row goes on (its event sequence is the log's): it is running again.
            conn.execute(sa.update(sessions).where(sessions.c.id == session_id).values(status="in_progress"))
            conn.execute(sa.insert(jobs).values(kind="run_turn", session_id=session_id, turn_id=turn_id, status="queued",
                                                created_at=0))
        deployment.turn_done(session_id)
        assert deployment.effects() == [key], "the replay deployed again"
        entry = deployment.entry()
        assert (entry["status"], entry["attempts"], entry["reuses"]) == ("succeeded", 1, 1)
        item = deployment.call_item(session_id)
        assert (item["status"], item["output"], item["ledger"]) == ("completed", "deployed:r-42", {"operation_key": key, "reused": True})
        engine.dispose()
    finally:
        deployment.close()


def test_the_agents_sdk_given_one_approved_state_on_two_workers_deploys_twice(tmp_path: Path) -> None:
    """The peer's side of the comparison above, in the same run: the OpenAI Agents SDK 0.24's
    approved `RunState` resumed by two worker processes at once executes the tool twice
    (research/sdk.md §1); Cairn's same scenario deploys once and reuses once."""
    state, effects = tmp_path / "approved.json", tmp_path / "effects.log"
    script = [sys.executable, str(Path(__file__).with_name("sdk_release.py"))]
    subprocess.run([*script, "pause", str(state), str(effects)], check=True, timeout=120)
    assert not effects.exists(), "the SDK ran the tool before it was approved"
    workers = [subprocess.Popen([*script, "resume", str(state), str(effects)]) for _ in range(2)]
    assert [worker.wait(timeout=120) for worker in workers] == [0, 0]
    assert effects.read_text().splitlines() == ["r-42", "r-42"]


def _job_statuses(engine: sa.Engine, turn_id: str) -> list[str]:
    with engine.connect() as conn:
        return sorted(str(s) for s in conn.execute(sa.select(jobs.c.status).where(jobs.c.turn_id == turn_id)).scalars())


# -- killed -------------------------------------------------------------------------------------


def test_killed_after_reserving_before_executing_the_takeover_deploys_once(ledger: Ledger) -> None:
    first = ledger.paused_worker("before_executing")
    session_id = ledger.start_session("ops-agent", "scripted:ledger_deploy_auto")
    ledger.wait_paused(first)
    assert ledger.entry()["status"] == "reserved" and ledger.attempts() == []
    ledger.kill(first)

    ledger.worker()
    ledger.turn_done(session_id)
    [key] = ledger.effects()
    entry = ledger.entry()
    assert (entry["operation_key"], entry["status"], entry["attempts"]) == (key, "succeeded", 1)
    assert (ledger.call(session_id)["output"], ledger.attempts()) == ("deployed:r-42", [key])


def test_killed_after_the_effect_the_probe_finds_it_and_its_result_is_the_calls(ledger: Ledger) -> None:
    first = ledger.paused_worker("after_effect")
    session_id, [action] = ledger.held("scripted:ledger_deploy_release")
    ledger.approve(action["request_id"])
    ledger.wait_paused(first)
    assert ledger.entry()["status"] == "executing" and len(ledger.effects()) == 1
    ledger.kill(first)

    ledger.worker()
    ledger.turn_done(session_id)
    assert len(ledger.effects()) == 1 and len(ledger.attempts()) == 1
    entry = ledger.entry()
    assert (entry["status"], entry["result"]) == ("succeeded", {"output": "deployed:r-42 (found by the probe)"})
    item = ledger.call_item(session_id)
    assert (item["status"], item["output"]) == ("completed", "deployed:r-42 (found by the probe)")
    assert item["ledger"]["probed"] is True and ledger.approval(action["request_id"])["started_at"] is not None


def test_killed_after_the_effect_without_a_probe_it_is_uncertain_until_a_person_resolves_it(ledger: Ledger) -> None:
    first = ledger.paused_worker("after_effect")
    session_id, [action] = ledger.held("scripted:ledger_deploy_unprobed")
    ledger.approve(action["request_id"])
    ledger.wait_paused(first)
    ledger.kill(first)

    ledger.worker()
    session = ledger.wait_session(session_id, "requires_action")
    entry = ledger.entry()
    assert entry["status"] == "uncertain" and "has no probe" in entry["reason"]
    [uncertain] = session["required_actions"]
    assert uncertain == {"type": "uncertain_effect", "call_id": entry["call_id"],
                         "operation_key": entry["operation_key"], "tool": "deploy_unprobed", "reason": entry["reason"],
                         "turn_id": action["turn_id"]}
    # The official client reads the session, unknown required action and all.
    with ledger.api.client() as client:
        seen = client.beta.agents.sessions.retrieve(session_id)
        assert seen.status == "requires_action" and seen.required_actions[0].type == "uncertain_effect"
    listed = json.loads(ledger.cli("ledger", "list", "--status", "uncertain").splitlines()[0])
    assert listed["operation_key"] == entry["operation_key"]
    # No automatic retry, ever: new workers find nothing to do.
    ledger.stop_workers()
    ledger.worker()
    assert ledger.session(session_id)["status"] == "requires_action"
    assert len(ledger.effects()) == 1 and len(ledger.attempts()) == 1

    shown = json.loads(ledger.cli("ledger", "show", entry["operation_key"]))
    assert shown["status"] == "uncertain"
    resolved = json.loads(ledger.cli("ledger", "resolve", entry["operation_key"], "--succeeded", "deployed by hand"))
    assert (resolved["status"], resolved["result"]) == ("succeeded", {"output": "deployed by hand"})
    ledger.turn_done(session_id)
    assert len(ledger.effects()) == 1 and len(ledger.attempts()) == 1
    item = ledger.call_item(session_id)
    assert (item["status"], item["output"], item["ledger"]["reused"]) == ("completed", "deployed by hand", True)
    assert "409" in ledger.cli("ledger", "resolve", entry["operation_key"], "--failed", "too late", check=False)


# -- failures -----------------------------------------------------------------------------------


def test_retryable_failures_are_retried_up_to_the_limit_and_a_terminal_one_never(scripts_dir: Path) -> None:
    ledger = Ledger(scripts_dir, None, CAIRN_LEDGER_MAX_ATTEMPTS="3")
    try:
        ledger.worker(env={"CAIRN_TEST_FLAKY": "2"})
        flaky = ledger.start_session("ops-agent", "scripted:ledger_flaky_deploy")
        broken = ledger.start_session("ops-agent", "scripted:ledger_broken_deploy")
        ledger.turn_done(flaky)
        ledger.turn_done(broken)
        by_tool = {e["tool_name"]: e for e in ledger.entries()}
        retried, failed = by_tool["flaky_deploy"], by_tool["broken_deploy"]
        assert (retried["status"], retried["attempts"]) == ("succeeded", 3)
        assert ledger.effects() == [retried["operation_key"]]
        assert (failed["status"], failed["attempts"], failed["error"]) == ("failed_terminal", 1, "release r-42 does not exist")
        assert ledger.attempts().count(failed["operation_key"]) == 1
        assert ledger.call(broken)["error"] == "release r-42 does not exist"

        ledger.stop_workers()
        ledger.worker(env={"CAIRN_TEST_FLAKY": "9"})
        hopeless = ledger.start_session("ops-agent", "scripted:ledger_flaky_deploy")
        ledger.turn_done(hopeless)
        gave_up = next(e for e in ledger.entries() if e["session_id"] == hopeless)
        assert (gave_up["status"], gave_up["attempts"]) == ("failed_terminal", 3)
        assert gave_up["error"] == "503 from the deploy API (gave up after 3 attempts)"
        assert ledger.attempts().count(gave_up["operation_key"]) == 3 and gave_up["operation_key"] not in ledger.effects()
        assert ledger.call(hopeless)["error"] == "503 from the deploy API"
    finally:
        ledger.close()


def test_the_same_key_with_other_arguments_is_refused_and_nothing_runs(ledger: Ledger) -> None:
    first = ledger.paused_worker("before_executing")
    session_id = ledger.start_session("ops-agent", "scripted:ledger_deploy_note")
    ledger.wait_paused(first)
    reserved = ledger.entry()
    ledger.kill(first)
    # Behind Cairn's back, the recorded call gets another note (its target, the release, stays).
    call = ledger.call(session_id)
    engine = ledger.engine()
    with engine.begin() as conn:
        data = conn.execute(sa.select(items.c.data).where(items.c.id == call["id"])).scalar_one()
        changed = {**data, "arguments": json.dumps({"release": "r-42", "note": "rolled by hand"})}
        conn.execute(sa.update(items).where(items.c.id == call["id"]).values(data=changed))
    engine.dispose()

    ledger.worker()
    ledger.turn_done(session_id)
    refused = ledger.call(session_id)["error"]
    assert refused.startswith(f"refused: operation {reserved['operation_key']} of deploy_note was already claimed with other arguments")
    assert ledger.effects() == [] and ledger.attempts() == []


# -- a stale worker ----------------------------------------------------------------------------


def test_a_worker_paused_past_its_lease_and_resumed_after_a_takeover_changes_nothing(ledger: Ledger) -> None:
    stale = ledger.paused_worker("after_effect")
    session_id = ledger.start_session("ops-agent", "scripted:ledger_deploy_auto")
    ledger.wait_paused(stale)
    os.kill(stale.pid, signal.SIGSTOP)
    try:
        ledger.worker()
        ledger.turn_done(session_id)
        [key] = ledger.effects()
        engine = ledger.engine()
        before = _state(engine, session_id)
        assert before["entries"][0]["status"] == "succeeded"
        ledger.go_path.write_text("go")
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    until_blocking(lambda: any(s in stale.log_since_start() for s in ("lease lost", "another writer owns it now")),
                   "the stale worker to find its lease taken over", timeout_s=60, seen=stale.log_since_start)
    assert _state(engine, session_id) == before
    assert ledger.effects() == [key] and ledger.session(session_id)["status"] == "idle"
    engine.dispose()


def _state(engine: sa.Engine, session_id: str) -> dict[str, Any]:
    """Everything the session's turn wrote, as stored."""
    from cairn.store.tables import events, ledger_entries

    with engine.connect() as conn:
        return {
            "items": _rows(conn, items, items.c.session_id == session_id),
            "turns": _rows(conn, turns, turns.c.session_id == session_id),
            "entries": _rows(conn, ledger_entries, ledger_entries.c.session_id == session_id),
            "events": conn.execute(sa.select(sa.func.count()).select_from(events).where(events.c.session_id == session_id)).scalar(),
        }


# -- many turns, random kills ------------------------------------------------------------------

_TURNS = 200
_WORKERS = 4
_KILLS = 8


@pytest.mark.slow
def test_many_turns_on_four_workers_killed_at_random_every_effect_happens_exactly_once(scripts_dir: Path) -> None:
    """200 turns on 4 worker processes, 8 of them SIGKILLed at random moments (each when the
    external record reaches a random count) and replaced: every effect exactly once by the
    external record, every entry settled or `uncertain` with a reason."""
    ledger = Ledger(scripts_dir, None, CAIRN_TEST_EFFECT_S="0.05", CAIRN_JOB_MAX_ATTEMPTS="100")
    rng = random.Random(16)
    try:
        # Every turn queued first, then the workers: the kills land while all four are busy.
        tools = {s: ("deploy_auto" if i % 2 else "deploy_auto_unprobed") for i, s in enumerate(
            ledger.start_session("ops-agent", f"scripted:ledger_{'deploy_auto' if i % 2 else 'deploy_auto_unprobed'}")
            for i in range(_TURNS))}
        starting = [threading.Thread(target=ledger.worker) for _ in range(_WORKERS)]
        for thread in starting:
            thread.start()
        for thread in starting:
            thread.join(timeout=120)
        for threshold in sorted(rng.sample(range(10, _TURNS - 10), _KILLS)):
            until_blocking(lambda t=threshold: len(ledger.effects()) >= t, f"{threshold} effects", timeout_s=120,
                           seen=lambda: len(ledger.effects()))
            ledger.kill(rng.choice(ledger.workers))
            ledger.worker()

        def settled() -> bool:
            return all(ledger.session(s)["status"] in ("idle", "requires_action") for s in tools)

        until_blocking(settled, "every turn to end or wait for a person", timeout_s=240, interval_s=0.5)
        entries = {e["session_id"]: e for e in _all_entries(ledger)}
        effects = ledger.effects()
        engine = ledger.engine()
        with engine.connect() as conn:
            taken_over = conn.execute(sa.select(sa.func.count()).select_from(jobs).where(jobs.c.attempts > 1)).scalar()
        engine.dispose()
        assert taken_over, "no kill interrupted a running turn"
        assert len(effects) == len(set(effects)), "an effect happened twice"
        assert set(effects) <= {e["operation_key"] for e in entries.values()}
        for session_id, tool in tools.items():
            entry = entries[session_id]
            count = effects.count(entry["operation_key"])
            if entry["status"] == "succeeded":
                assert count == 1, entry
            else:
                assert entry["status"] == "uncertain" and entry["reason"] and count <= 1, entry
                assert tool == "deploy_auto_unprobed", "a tool with a probe is never left uncertain"
    finally:
        ledger.close()


def _all_entries(ledger: Ledger) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        page = ledger.entries(**({"after": after} if after else {}))
        found += page
        if len(page) < 100:
            return found
        after = page[-1]["operation_key"]
