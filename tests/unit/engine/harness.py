"""A data dir with a real SQLite database for the engine's unit tests: runtimes opened on it
(a restart is a new runtime on the same files), sessions whose turns a scripted model plays,
a fake sandbox, and what the turns stored.

No server and no sleep: a test claims the job a session queued and runs it with a
`TurnRunner`, as a worker would, then reads the database.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from cairn.blobs import BlobStore
from cairn.config import Settings
from cairn.durable.keyring import LocalKeyring
from cairn.durable.sealing import Sealer
from cairn.engine.approvals import ApprovalGate
from cairn.engine.environment import Environments
from cairn.engine.journal import Journal
from cairn.engine.ledger import LedgerReserve
from cairn.engine.loop import TurnRunner
from cairn.engine.loop.begin import TurnStart, begin_turn
from cairn.engine.loop.recorder import TurnRecorder
from cairn.engine.notifier import Notifier
from cairn.engine.runtime import Runtime
from cairn.engine.sessions import SessionService
from cairn.engine.tools import PROCEED, AllowEveryCall, GatePolicy, Hold, ToolContext, ToolPolicies, Verdict
from cairn.engine.tools.pipeline import CallInFlight
from cairn.engine.wire import render_required_action
from cairn.models.base import Model
from cairn.models.registry import check_model_name, resolve_model
from cairn.operator import LoadedAgents
from cairn.sandbox.base import ExecRequest, ExecResult, OutputSink, SandboxBackend
from cairn.snapshots import SnapshotStoreConfig, open_snapshot_store
from cairn.store.db import Database
from cairn.store.events import read_events_after
from cairn.store.items import ItemRecord, session_items
from cairn.store.jobs import Job, claim_job
from cairn.store.migrate import upgrade
from cairn.store.sessions import SessionRecord, get_session
from cairn.store.turns import TurnRecord, get_turn

Events = list[dict[str, Any]]


@dataclass(slots=True)
class FakeSandbox(SandboxBackend):
    """Runs nothing: each command gets the output chunks and exit code a test set for it
    (default: no output, exit 0), or what `on_exec` returns when it returns a result."""

    name = "fake"
    replies: dict[str, tuple[list[bytes], int | None]] = field(default_factory=dict)
    commands: list[ExecRequest] = field(default_factory=list)
    on_exec: Callable[[ExecRequest, OutputSink], Any] | None = None

    async def exec(self, request: ExecRequest, on_output: OutputSink) -> ExecResult:
        self.commands.append(request)
        if self.on_exec is not None:
            result = await self.on_exec(request, on_output)
            if result is not None:
                return result
        chunks, exit_code = self.replies.get(request.command, ([], 0))
        for chunk in chunks:
            await on_output(chunk)
        return ExecResult(exit_code=exit_code, duration_s=0.002)


class PathGate(GatePolicy):
    """A fake approval gate: holds every call on one of `held` paths until `released`, and
    notes the path of each call it is asked about.

    Its release stands for a decision stored elsewhere (an approval): a restarted process
    gets a gate that knows it."""

    def __init__(self, *held: str, released: bool = False) -> None:
        self.held = frozenset(held)
        self.released = released
        self.asked: list[str] = []

    @staticmethod
    def hold(call_id: str) -> Hold:
        return Hold(call_id=call_id, action_kind="test_gate_hold", action={"reason": "held by the test"})

    def _holds(self, call: CallInFlight) -> bool:
        return call.call.arguments.get("path") in self.held and not self.released

    async def run(self, call: CallInFlight) -> Verdict:
        self.asked.append(str(call.call.arguments.get("path")))
        if self._holds(call):
            return self.hold(call.call.call_id)
        return PROCEED

    async def vouches_for_rerun(self, call: CallInFlight) -> bool:
        return self._holds(call)


class EngineHarness:
    """One data dir; `runtime` is the process currently open on it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.scripts = root / "scripts"
        self.scripts.mkdir()
        self.settings = Settings(data_dir=root / "data", scripts_dir=self.scripts, snapshot_store="none", poll_interval_s=0.01)
        self.settings.data_dir.mkdir()
        self.sandbox = FakeSandbox()
        self._runtime: Runtime | None = None
        self.agents = LoadedAgents()
        # Whether calls go through the approvals gate (`cairn.engine.approvals`), as in a deployment.
        self.gated = False
        self.turn_ids: dict[str, str] = {}  # each session's first turn

    @property
    def runtime(self) -> Runtime:
        assert self._runtime is not None, "no runtime is open"
        return self._runtime

    async def open(
        self, policies: ToolPolicies | None = None, *, resolve: Callable[[str], Model] | None = None, agents: LoadedAgents | None = None
    ) -> Runtime:
        """Open a runtime on the data dir, as a (re)started process would; with `agents`, the
        operator's agents it loaded (else those of the last runtime opened). Without
        `policies`, its reserve stage is the deployment's idempotency ledger, and with `gated`
        set its gate is the deployment's too: the approvals gate."""
        if agents is not None:
            self.agents = agents
        db = Database(self.settings.resolved_database_url)
        await upgrade(db)
        notifier = Notifier()
        journal = Journal(db, notifier)
        blobs = BlobStore(self.settings.blobs_dir)
        sealer = Sealer(LocalKeyring.from_settings(self.settings))
        if policies is None:
            # As `cairn.bootstrap` builds them: the ledger always, the approvals gate when gated.
            ledger = LedgerReserve(db, blobs, sealer, self.settings)
            gate = ApprovalGate(journal, self.agents, self.settings, sealer, reserve=ledger) if self.gated else AllowEveryCall()
            policies = ToolPolicies(gate=gate, reserve=ledger)
        self._runtime = Runtime(
            settings=self.settings,
            db=db,
            notifier=notifier,
            journal=journal,
            sandbox=self.sandbox,
            blobs=blobs,
            environments=Environments(self.settings.workspaces_dir, self.sandbox, open_snapshot_store(SnapshotStoreConfig(backend="none")), db),
            resolve_model=resolve or partial(resolve_model, settings=self.settings),
            check_model=partial(check_model_name, settings=self.settings),
            sealer=sealer,
            tool_policies=policies,
            agents=self.agents,
        )
        return self._runtime

    async def close(self) -> None:
        if self._runtime is not None:
            await self._runtime.db.dispose()
            self._runtime = None

    async def restart(self, policies: ToolPolicies | None = None, *, agents: LoadedAgents | None = None) -> Runtime:
        """The process is gone; a new one opens the same data dir (nothing in memory survives
        but the operator's agents, which it loads again: `agents` when they changed)."""
        await self.close()
        return await self.open(policies, agents=agents)

    def script(self, *turns: Sequence[Mapping[str, Any]]) -> None:
        """What `scripted:test` plays: one list of steps per turn."""
        (self.scripts / "test.json").write_text(json.dumps({"turns": [list(t) for t in turns]}))

    async def create_session(
        self,
        *,
        files: Mapping[str, str] | None = None,
        tools: Sequence[Mapping[str, Any]] = (),
        workspace: bool = True,
        agent_id: str | None = None,
        vault_ids: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> str:
        """A session with one queued turn ("go"); its workspace, made by the worker that first
        runs a turn (or by `prepare_workspace`), starts with `files`. With `agent_id`, it runs
        that registered agent (its model and instructions, `tools` as client tools); `vault_ids`
        name the tenant's vaults whose credentials its turns get, `env` its plain variables."""
        message = {"role": "user", "content": [{"type": "input_text", "text": "go"}]}
        inline = [{"type": "inline", "path": p, "data": base64.b64encode(c.encode()).decode()} for p, c in (files or {}).items()]
        body = {
            "agent": {"tools": list(tools)} if agent_id is not None else {"model": "scripted:test", "tools": list(tools)},
            "agent_id": agent_id,
            "environment": {"type": "openai_hosted", "files": inline, "env": dict(env or {})} if workspace else {"type": "none"},
            "input": [message],
            "vault_ids": list(vault_ids),
        }
        created = await SessionService(self.runtime).create("t1", body)
        assert created.turn_id is not None
        self.turn_ids[created.session.id] = created.turn_id
        return created.session.id

    async def prepare_workspace(self, session_id: str) -> None:
        """Make the session's workspace as the worker running its first turn would."""
        session = await self.session(session_id)
        await self.runtime.environments.acquire(session.tenant, session_id, session.environment)

    def workspace(self, session_id: str) -> Path:
        return self.runtime.environments.workspace_of(session_id)

    async def claim(self, *, lease_s: float = 300) -> Job:
        job = await claim_job(self.runtime.db, owner="test", lease_s=lease_s)
        assert job is not None, "no job is queued"
        return job

    async def has_job(self) -> bool:
        """Whether a job is claimable now (claiming it, so call it last)."""
        return await claim_job(self.runtime.db, owner="test", lease_s=300) is not None

    async def run_job(self, *, lease_s: float = 300) -> list[Events]:
        """Claim the queued job and run its turn; returns the events published, one list per
        committed transaction."""
        job = await self.claim(lease_s=lease_s)
        with self.runtime.notifier.subscribe(job.session_id) as subscription:
            await TurnRunner(self.runtime).run(job)
            published, overflowed = subscription.take()
        assert not overflowed
        return [[json.loads(r.data) for r in p.records] for p in published]

    async def begin(self) -> tuple[TurnStart, TurnRecorder]:
        """Claim the queued job and take up its turn, as the runner does before its first step."""
        start = await begin_turn(self.runtime, await self.claim())
        assert start is not None
        return start, TurnRecorder(self.runtime.journal, start.job, start.session, start.turn, start.items)

    async def tool_context(self, session_id: str, *, call_id: str = "call_1", streamed: list[str] | None = None) -> ToolContext:
        """What a tool sees of a call of the session's turn; streamed output goes to `streamed`."""
        session = await self.session(session_id)
        return ToolContext(session=session, turn_id=self.turn_ids[session_id], call_id=call_id, stream_output=(streamed if streamed is not None else []).append)

    async def items(self, session_id: str) -> list[ItemRecord]:
        async with self.runtime.db.read() as conn:
            return await session_items(conn, session_id)

    async def events(self, session_id: str) -> Events:
        async with self.runtime.db.read() as conn:
            return [json.loads(r.data) for r in await read_events_after(conn, session_id, 0, limit=100_000)]

    async def session(self, session_id: str) -> SessionRecord:
        async with self.runtime.db.read() as conn:
            session = await get_session(conn, session_id)
        assert session is not None
        return session

    async def required_actions(self, session_id: str) -> list[dict[str, Any]]:
        """The session's required actions as the API shows them."""
        return [render_required_action(a) for a in (await self.session(session_id)).required_actions]

    async def turn(self, turn_id: str) -> TurnRecord:
        async with self.runtime.db.read() as conn:
            turn = await get_turn(conn, turn_id)
        assert turn is not None
        return turn


def call_events(batch: Events) -> list[tuple[str, str, str | None]]:
    """(event kind, item type, item status) of the item events about calls and their outputs."""
    return [
        (e["type"].rsplit(".", 1)[-1], e["item"]["type"], e["item"].get("status"))
        for e in batch
        if "item" in e and (e["item"]["type"].startswith("function_call") or e["item"]["type"] == "command_execution")
    ]
