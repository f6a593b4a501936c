"""The agent loop: runs one turn for a claimed job until it completes, fails, is
cancelled, or waits for the client.

Each iteration: run the turn's workspace calls that have no result yet, stop if client
calls are pending (`requires_action`), otherwise ask the model for the next step and
record it. The step counter (`turns.step`) advances in the same transaction that records
the step's calls, so after a crash the turn resumes at the first unrecorded step (run
state by reference: the items are the history). A workspace call that was running when
the process died cannot be known to have run or not; it is closed as `incomplete` and the
model is told, except for read-only tools, which simply run again. For the same reason a
step whose calls all only read the workspace runs them first and records the step, its
calls and their results in one transaction; its events are the same as if the calls had
run after their record.

Every write goes through the journal, and its first statement is the fence on the job's
lease token (for a model step, the fenced update of the run state itself), so a worker
that lost its lease cannot touch the turn (design invariant 1 for events; fencing per style).
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from cairn.engine.artifacts import collect_outputs, record_outputs
from cairn.engine.events import environment_event, item_event, text_part_event, turn_event
from cairn.engine.journal import Journal, Transaction
from cairn.engine.lifecycle import add_call_output, close_open_item, close_turn, set_session_status
from cairn.engine.history import History
from cairn.engine.model_input import client_tool_specs
from cairn.engine.runtime import Runtime
from cairn.engine.tools import (
    WORKSPACE_TOOL_NAMES,
    is_read_only_tool,
    parse_shell_arguments,
    run_file_tool,
    workspace_tool_specs,
)
from cairn.errors import CairnError, InvalidRequestError, LeaseLostError, ModelError, StatusConflictError
from cairn.models.base import Model, ModelRequest, ModelResponse, TextDelta, ToolCall, ToolSpec, Usage
from cairn.sandbox.base import WORKSPACE_MOUNT, ExecRequest
from cairn.snapshots import StartOutcome
from cairn.states import EnvironmentStatus, ItemStatus, SessionStatus, TurnStatus
from cairn.store.items import ItemRecord, insert_item, new_item, pending_client_calls, session_items, transition_item, turn_items
from cairn.store.jobs import Job, complete_job
from cairn.store.required_actions import RequiredAction, add_required_actions
from cairn.store.sessions import SessionRecord, get_session, set_environment_status
from cairn.store.turns import TurnRecord, advance_step, fence_turn, get_turn, transition_turn, update_turn

__all__ = ["TurnRunner"]

log = logging.getLogger(__name__)

_FLUSH_INTERVAL_S = 0.05
_MAX_ITEM_OUTPUT = 1024 * 1024
_MODEL_ATTEMPTS = 3
_TRUNCATION_NOTICE = f"\n[output beyond {_MAX_ITEM_OUTPUT} characters is neither streamed nor stored]\n"
_INTERRUPTED = "interrupted: Cairn stopped while this call ran; it may or may not have taken effect"


@dataclass(frozen=True, slots=True)
class _StepDone:
    """The run state a recorded model step leaves behind."""

    step: int
    usage: dict[str, int]
    next_output_index: int


@dataclass(frozen=True, slots=True)
class _CallResult:
    """What a workspace file call returned: its output text, or the error the model sees."""

    output: str | None = None
    error: str | None = None

    @property
    def status(self) -> ItemStatus:
        return ItemStatus.COMPLETED if self.error is None else ItemStatus.FAILED


@dataclass(slots=True)
class _TurnContext:
    job: Job
    session: SessionRecord
    turn: TurnRecord
    model: Model
    tools: list[ToolSpec]
    client_tool_names: frozenset[str] = field(default_factory=frozenset)
    # Stream deltas wait here until the next write or the periodic flush; one lock orders
    # all of the turn's writes, so deltas never overtake the events that follow them.
    deltas: list[dict[str, Any]] = field(default_factory=list)
    write_lock: anyio.Lock = field(default_factory=anyio.Lock)
    # Reloaded only after the client may have added tool results.
    history: History = field(default_factory=History)
    next_output_index: int = 0

    def take_deltas(self) -> list[dict[str, Any]]:
        taken, self.deltas = self.deltas, []
        return taken

    def remember(self, item: ItemRecord) -> None:
        self.history.remember(item)

    def open_items(self, tool_kind: str) -> list[ItemRecord]:
        return self.history.open_calls(self.turn.id, tool_kind)


class TurnRunner:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.journal: Journal = runtime.journal

    async def run(self, job: Job) -> None:
        """Run the job's turn as far as it goes; every exit leaves the job completed or leased out."""
        ctx = await self._begin(job)
        if ctx is None:
            return
        try:
            failure: Exception | None = None
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._watch_cancel, ctx, scope)
                    tg.start_soon(self._flush_deltas, ctx)
                    # Caught here, not outside: a task group would wrap it in an ExceptionGroup.
                    try:
                        await self._loop(ctx)
                    except Exception as exc:
                        failure = exc
                    tg.cancel_scope.cancel()
            if failure is not None:
                raise failure
            if scope.cancelled_caught:
                with anyio.CancelScope(shield=True):
                    await self._finish(ctx, TurnStatus.CANCELLED)
        except (LeaseLostError, StatusConflictError) as exc:
            log.warning("turn %s: another writer owns it now (%s)", ctx.turn.id, exc)
        except ModelError as exc:
            with anyio.CancelScope(shield=True):
                await self._finish(ctx, TurnStatus.FAILED, error={"code": exc.code, "message": exc.message})
        except Exception as exc:
            log.exception("turn %s failed", ctx.turn.id)
            message = exc.message if isinstance(exc, CairnError) else f"internal error: {type(exc).__name__}"
            with anyio.CancelScope(shield=True):
                await self._finish(ctx, TurnStatus.FAILED, error={"code": "internal_error", "message": message})
        finally:
            await ctx.model.aclose()

    # -- starting and finishing -------------------------------------------------------

    async def _begin(self, job: Job) -> _TurnContext | None:
        assert job.turn_id is not None
        async with self.rt.db.read() as conn:
            turn = await get_turn(conn, job.turn_id)
            session = await get_session(conn, job.session_id)
        if not _is_runnable(turn, session):
            await self._settle_unrunnable(job)
            return None
        assert turn is not None and session is not None
        try:
            model = self.rt.resolve_model(session.agent["model"])
        except CairnError as exc:
            await self._fail_before_start(job, turn, {"code": "invalid_request", "message": exc.message})
            return None
        # The workspace is ready before the turn starts, so its events precede the turn's.
        if session.environment["type"] != "none":
            failure = await self._acquire_workspace(session, turn)
            if failure is not None:
                await self._fail_before_start(job, turn, failure)
                return None
        try:
            async with self.journal.transaction(job.session_id) as tx:
                turn = await get_turn(tx.conn, job.turn_id)
                session = await get_session(tx.conn, job.session_id)
                if not _is_runnable(turn, session):
                    unrunnable = True
                else:
                    assert turn is not None and session is not None
                    unrunnable = False
                    if turn.status == "queued":
                        turn = await self._start(tx, turn, session, job)
                    else:
                        # A worker died with the turn: take it over under this job's lease.
                        turn = await transition_turn(tx.conn, turn, TurnStatus.IN_PROGRESS, lease_token=job.lease_token)
                        await self._recover(tx, turn)
                    session = await get_session(tx.conn, job.session_id)
                    assert session is not None
                    history = await session_items(tx.conn, session.id)
        except StatusConflictError:
            unrunnable = True  # the turn moved (was cancelled) between its read and this write
        if unrunnable:
            await self._settle_unrunnable(job)
            return None
        assert turn is not None and session is not None
        client_tools = client_tool_specs(session.agent)
        tools = (workspace_tool_specs() if session.environment["type"] != "none" else []) + client_tools
        return _TurnContext(
            job=job,
            session=session,
            turn=turn,
            model=model,
            tools=tools,
            client_tool_names=frozenset(t.name for t in client_tools),
            history=History(history),
            next_output_index=turn.next_output_index,
        )

    async def _settle_unrunnable(self, job: Job) -> None:
        """Finish a job whose turn is gone, over, or cancelled before it started."""
        assert job.turn_id is not None
        async with self.journal.transaction(job.session_id) as tx:
            turn = await get_turn(tx.conn, job.turn_id)
            if turn is not None and turn.status in ("queued", "in_progress") and turn.cancel_requested:
                await close_turn(tx, turn, TurnStatus.CANCELLED)
            await complete_job(tx.conn, job)

    async def _fail_before_start(self, job: Job, turn: TurnRecord, error: dict[str, str]) -> None:
        try:
            async with self.journal.transaction(job.session_id) as tx:
                await close_turn(tx, turn, TurnStatus.FAILED, error=error)
                await complete_job(tx.conn, job)
        except StatusConflictError:
            await self._settle_unrunnable(job)  # closed (cancelled) while its workspace was prepared

    async def _acquire_workspace(self, session: SessionRecord, turn: TurnRecord) -> dict[str, str] | None:
        """Reuse, restore or create the workspace, with its events; the turn's error on failure."""
        try:
            started = await self.rt.environments.acquire(session.tenant, session.id, session.environment)
        except CairnError as exc:
            async with self.journal.transaction(session.id) as tx:
                tx.emit(environment_event("failed", session, status="failed", turn_id=turn.id))
            return {"code": "sandbox_error", "message": f"the workspace could not be prepared: {exc.message}"}
        was_suspended = session.environment_status == EnvironmentStatus.SUSPENDED
        if started is not None and (started.outcome is StartOutcome.RESTORED or was_suspended):
            async with self.journal.transaction(session.id) as tx:
                current = await set_environment_status(tx.conn, session.id, EnvironmentStatus.READY)
                assert current is not None
                if started.outcome is StartOutcome.RESTORED:
                    tx.emit(environment_event("pending", current, status="pending", turn_id=turn.id))
                tx.emit(environment_event("ready", current, status="ready", turn_id=turn.id))
        return None

    async def _start(self, tx: Transaction, turn: TurnRecord, session: SessionRecord, job: Job) -> TurnRecord:
        if session.status != "in_progress":
            await set_session_status(tx, session.id, SessionStatus.IN_PROGRESS)
        turn = await transition_turn(tx.conn, turn, TurnStatus.IN_PROGRESS, started_at=time.time(), lease_token=job.lease_token)
        tx.emit(turn_event("in_progress", turn))
        for message in turn.input:
            item = await insert_item(
                tx.conn,
                new_item(
                    session_id=turn.session_id,
                    turn_id=turn.id,
                    type="message",
                    data={"role": "user", "phase": None, "content": message["content"]},
                ),
            )
            tx.emit(item_event("added", item, None))
        return turn

    async def _recover(self, tx: Transaction, turn: TurnRecord) -> None:
        """Close what a dead worker left open; read-only calls stay open to run again."""
        for item in await turn_items(tx.conn, turn.id):
            if item.status != "in_progress" or item.tool_kind == "client":
                continue
            if item.tool_kind == "workspace" and is_read_only_tool(str(item.data.get("name"))):
                continue
            closed = await close_open_item(tx, item, _INTERRUPTED)
            if closed.type == "function_call":
                await add_call_output(tx, closed, output=None, error=_INTERRUPTED)

    async def _finish(self, ctx: _TurnContext, status: TurnStatus, *, error: dict[str, str] | None = None) -> None:
        try:
            async with self._write(ctx) as tx:
                await close_turn(tx, ctx.turn, status, error=error)
                await complete_job(tx.conn, ctx.job)
        except (LeaseLostError, StatusConflictError):
            log.warning("turn %s: lease lost before it could be marked %s", ctx.turn.id, status)

    @asynccontextmanager
    async def _write(self, ctx: _TurnContext, step: _StepDone | None = None) -> AsyncIterator[Transaction]:
        """A journal transaction of the running turn, fenced by the job's lease token first (in
        one statement with the run state of a finished model `step`), that appends the deltas
        waiting to be sent before anything else it emits."""
        async with ctx.write_lock, self.journal.transaction(ctx.session.id) as tx:
            token = ctx.job.lease_token
            if step is None:
                await fence_turn(tx.conn, ctx.turn.id, token)
                turn = ctx.turn
            else:
                turn = await advance_step(
                    tx.conn, ctx.turn, token, step=step.step, usage=step.usage, next_output_index=step.next_output_index
                )
            tx.emit(*ctx.take_deltas())
            yield tx
            if ctx.next_output_index != turn.next_output_index:
                turn = await update_turn(tx.conn, turn.id, next_output_index=ctx.next_output_index)
            ctx.turn = turn

    async def _flush_deltas(self, ctx: _TurnContext) -> None:
        while True:
            await anyio.sleep(_FLUSH_INTERVAL_S)
            if not ctx.deltas:
                continue
            try:
                # Shielded: deltas taken into a transaction must not be lost to a cancel.
                with anyio.CancelScope(shield=True):
                    async with self._write(ctx):
                        pass
            except LeaseLostError:
                return  # the loop's next write raises it where it is handled

    async def _watch_cancel(self, ctx: _TurnContext, scope: anyio.CancelScope) -> None:
        while True:
            async with self.rt.db.read() as conn:
                turn = await get_turn(conn, ctx.turn.id)
            if turn is None or turn.cancel_requested:
                scope.cancel()
                return
            await anyio.sleep(self.rt.settings.poll_interval_s)

    # -- the loop ---------------------------------------------------------------------

    async def _loop(self, ctx: _TurnContext) -> None:
        while True:
            for item in ctx.open_items("workspace"):
                await self._execute(ctx, item)
            if ctx.open_items("client"):
                async with self._write(ctx) as tx:
                    waiting = await pending_client_calls(tx.conn, ctx.turn.id)
                    if waiting:
                        await self._wait_for_client(tx, ctx, waiting)
                        return
                    # The client answered while the workspace calls ran: take its results.
                    ctx.history = History(await session_items(tx.conn, ctx.session.id))
            response = await self._model_step(ctx)
            if not response.tool_calls:
                await self._complete(ctx)
                return

    async def _wait_for_client(self, tx: Transaction, ctx: _TurnContext, calls: list[ItemRecord]) -> None:
        turn = await transition_turn(tx.conn, ctx.turn, TurnStatus.WAITING, lease_token=None)
        actions = [
            RequiredAction(turn.session_id, turn.id, str(c.call_id), "function_call", {"name": c.data["name"], "arguments": c.data["arguments"]})
            for c in calls
        ]
        await add_required_actions(tx.conn, actions)
        await set_session_status(tx, ctx.session.id, SessionStatus.REQUIRES_ACTION)
        await complete_job(tx.conn, ctx.job)

    async def _complete(self, ctx: _TurnContext) -> None:
        async with self.rt.db.read() as conn:
            session = await get_session(conn, ctx.session.id)
        assert session is not None
        outputs = []
        if session.environment["type"] != "none":
            outputs = await collect_outputs(self.rt.environments.files(session.id), self.rt.blobs, session)
        async with self._write(ctx) as tx:
            await record_outputs(tx.conn, session, ctx.turn.id, outputs)
            await close_turn(tx, ctx.turn, TurnStatus.COMPLETED)
            await complete_job(tx.conn, ctx.job)

    # -- one model step ---------------------------------------------------------------

    async def _model_step(self, ctx: _TurnContext) -> ModelResponse:
        for attempt in range(1, _MODEL_ATTEMPTS + 1):
            message: ItemRecord | None = None
            try:
                turn = ctx.turn
                request = ModelRequest(
                    session_id=ctx.session.id,
                    turn_id=turn.id,
                    turn_ordinal=turn.ordinal,
                    step=turn.step,
                    model=str(ctx.session.agent["model"]),
                    instructions=ctx.session.agent.get("instructions"),
                    input=ctx.history.model_input(),
                    tools=ctx.tools,
                    text_format=(ctx.session.agent.get("text") or {}).get("format"),
                    reasoning_effort=(ctx.session.agent.get("reasoning") or {}).get("effort"),
                )
                text: list[str] = []
                async for event in ctx.model.stream(request):
                    if isinstance(event, TextDelta):
                        if message is None:
                            message = await self._open_message(ctx)
                        text.append(event.text)
                        assert message.output_index is not None
                        ctx.deltas.append(text_part_event("output_text.delta", message, message.output_index, delta=event.text))
                    else:
                        await self._record_step(ctx, message, event)
                        return event
                raise ModelError("the model stream ended without a response", code="server_error", retryable=True)
            except ModelError as exc:
                if message is not None:
                    await self._abandon_message(ctx, message)
                if not exc.retryable or attempt == _MODEL_ATTEMPTS:
                    raise
                log.warning("turn %s: model attempt %d failed (%s); retrying", ctx.turn.id, attempt, exc.message)
                await anyio.sleep(2 ** (attempt - 1))
        raise AssertionError("unreachable")

    async def _new_item(self, tx: Transaction, ctx: _TurnContext, type_: str, data: dict[str, Any], **cols: Any) -> ItemRecord:
        output_index = ctx.next_output_index
        ctx.next_output_index += 1
        item = await insert_item(
            tx.conn,
            new_item(
                session_id=ctx.session.id,
                turn_id=ctx.turn.id,
                type=type_,
                data=data,
                status=cols.pop("status", ItemStatus.IN_PROGRESS),
                call_id=cols.pop("call_id", None),
                tool_kind=cols.pop("tool_kind", None),
                output_index=output_index,
            ),
        )
        ctx.remember(item)
        return item

    async def _open_message(self, ctx: _TurnContext) -> ItemRecord:
        async with self._write(ctx) as tx:
            item = await self._new_item(tx, ctx, "message", {"role": "assistant", "phase": None, "content": []})
            assert item.output_index is not None
            tx.emit(
                item_event("added", item, item.output_index),
                text_part_event("content_part.added", item, item.output_index, part={"type": "output_text", "text": ""}),
            )
        return item

    async def _abandon_message(self, ctx: _TurnContext, message: ItemRecord) -> None:
        async with self._write(ctx) as tx:
            closed = await transition_item(tx.conn, message, ItemStatus.INCOMPLETE, data=message.data)
            ctx.remember(closed)
            tx.emit(item_event("done", closed, closed.output_index))

    async def _record_step(self, ctx: _TurnContext, message: ItemRecord | None, response: ModelResponse) -> None:
        """Advance the step, close its message and record its calls, atomically; with their
        results too when every call only reads the workspace (`_run_reads_ahead`)."""
        try:
            results = await self._run_reads_ahead(ctx, response.tool_calls)
        except Exception:
            # What the model asked for stays on record, as for a call run after its record:
            # the calls stay open and the turn's failure closes them.
            await self._store_step(ctx, message, response, None)
            raise
        await self._store_step(ctx, message, response, results)

    async def _store_step(
        self, ctx: _TurnContext, message: ItemRecord | None, response: ModelResponse, results: list[_CallResult] | None
    ) -> None:
        opens_message = bool(response.text) and message is None
        done = _StepDone(
            step=ctx.turn.step + 1,
            usage=_add_usage(ctx.turn.usage, response.usage),
            next_output_index=ctx.next_output_index + opens_message + len(response.tool_calls),
        )
        async with self._write(ctx, done) as tx:
            if opens_message:
                message = await self._new_item(tx, ctx, "message", {"role": "assistant", "phase": None, "content": []})
                assert message.output_index is not None
                tx.emit(
                    item_event("added", message, message.output_index),
                    text_part_event("content_part.added", message, message.output_index, part={"type": "output_text", "text": ""}),
                    text_part_event("output_text.delta", message, message.output_index, delta=response.text),
                )
            if message is not None:
                ctx.remember(await self._close_message(tx, message, response))
            if results is None:
                for call in response.tool_calls:
                    await self._record_call(tx, ctx, call)
                return
            # Finished calls are stored finished, and the stream shows them as if each had
            # run after its record: every call added, then each one done with its result.
            items = [await self._record_call(tx, ctx, c, finished=r.status) for c, r in zip(response.tool_calls, results)]
            for item, result in zip(items, results):
                await self._record_result(tx, ctx, item, result)

    async def _close_message(self, tx: Transaction, message: ItemRecord, response: ModelResponse) -> ItemRecord:
        text = response.text or ""
        part = {"type": "output_text", "text": text, "annotations": []}
        phase = "commentary" if response.tool_calls else "final_answer"
        closed = await transition_item(
            tx.conn, message, ItemStatus.COMPLETED, data={"role": "assistant", "phase": phase, "content": [part]}
        )
        index = closed.output_index
        assert index is not None
        tx.emit(
            text_part_event("output_text.done", closed, index, text=text),
            text_part_event("content_part.done", closed, index, part=part),
            item_event("done", closed, index),
        )
        return closed

    async def _record_call(self, tx: Transaction, ctx: _TurnContext, call: ToolCall, *, finished: ItemStatus | None = None) -> ItemRecord:
        """Record a call as started, or already `finished` with that status (announced as started)."""
        arguments = json.dumps(dict(call.arguments), ensure_ascii=False)
        if call.name == "shell" and "shell" not in ctx.client_tool_names:
            command = call.arguments.get("command")
            item = await self._new_item(
                tx,
                ctx,
                "command_execution",
                {"command": command if isinstance(command, str) else arguments, "cwd": WORKSPACE_MOUNT, "output": "",
                 "exit_code": None, "duration_ms": None, "arguments": arguments},
                call_id=call.call_id,
                tool_kind="workspace",
            )
            tx.emit(item_event("added", item, item.output_index))
            return item
        kind = "client" if call.name in ctx.client_tool_names else "workspace"
        data = {"call_id": call.call_id, "name": call.name, "arguments": arguments}
        item = await self._new_item(
            tx, ctx, "function_call", data, call_id=call.call_id, tool_kind=kind, status=finished or ItemStatus.IN_PROGRESS
        )
        started = item if finished is None else dataclasses.replace(item, status=ItemStatus.IN_PROGRESS)
        tx.emit(item_event("added", started, item.output_index))
        if kind == "client":
            tx.emit(item_event("done", item, item.output_index))
        return item

    # -- workspace calls --------------------------------------------------------------

    async def _run_reads_ahead(self, ctx: _TurnContext, calls: Sequence[ToolCall]) -> list[_CallResult] | None:
        """Run the step's calls before they are recorded if every one only reads the workspace.

        Such a call needs no record before it runs: running it again after a crash is
        harmless (recovery does just that), so the step, its calls and their results are
        stored in one transaction. Returns None, running nothing, if any call may change
        something: those are recorded first and run after (`_execute`).
        """
        if not calls or not all(is_read_only_tool(c.name) and c.name not in ctx.client_tool_names for c in calls):
            return None
        return [await self._run_file_call(ctx, c.name, c.arguments) for c in calls]

    async def _run_file_call(self, ctx: _TurnContext, name: str, arguments: Mapping[str, Any]) -> _CallResult:
        if name not in WORKSPACE_TOOL_NAMES:
            return _CallResult(error=f"unknown tool {name!r}; available tools: {', '.join(t.name for t in ctx.tools)}")
        try:
            return _CallResult(output=await run_file_tool(name, arguments, self.rt.environments.files(ctx.session.id)))
        except InvalidRequestError as exc:
            return _CallResult(error=exc.message)

    async def _record_result(self, tx: Transaction, ctx: _TurnContext, call: ItemRecord, result: _CallResult) -> None:
        """Announce the finished `call` and store its result."""
        tx.emit(item_event("done", call, call.output_index))
        ctx.remember(call)
        ctx.remember(await add_call_output(tx, call, output=result.output, error=result.error))

    async def _execute(self, ctx: _TurnContext, item: ItemRecord) -> None:
        arguments = _decode_arguments(item.data.get("arguments"))
        if item.type == "command_execution":
            await self._run_shell(ctx, item, arguments)
            return
        result = await self._run_file_call(ctx, str(item.data["name"]), arguments)
        async with self._write(ctx) as tx:
            done = await transition_item(tx.conn, item, result.status, data=item.data)
            await self._record_result(tx, ctx, done, result)

    async def _run_shell(self, ctx: _TurnContext, item: ItemRecord, arguments: Mapping[str, Any]) -> None:
        data = dict(item.data)
        try:
            args = parse_shell_arguments(arguments)
        except InvalidRequestError as exc:
            data.update(output=exc.message, exit_code=None, duration_ms=0)
            await self._close_command(ctx, item, data, ItemStatus.FAILED)
            return
        workspace = self.rt.environments.workspace_of(ctx.session.id)
        env = ctx.session.env
        network = (ctx.session.environment.get("network") or {}).get("access") == "enabled"
        timeout_s = args.timeout_ms / 1000 if args.timeout_ms else self.rt.settings.command_timeout_s
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        collected: list[str] = []
        size = 0

        async def on_output(chunk: bytes) -> None:
            nonlocal size
            text = decoder.decode(chunk)
            if not text:
                return
            # What is streamed is what is stored: up to _MAX_ITEM_OUTPUT characters, so one noisy
            # command cannot fill the event log.
            kept = text[: max(0, _MAX_ITEM_OUTPUT - size)]
            if kept:
                collected.append(kept)
                ctx.deltas.append(_output_delta(ctx, item, kept))
            if size < _MAX_ITEM_OUTPUT <= size + len(text):
                ctx.deltas.append(_output_delta(ctx, item, _TRUNCATION_NOTICE))
            size += len(text)

        request = ExecRequest(command=args.command, workspace=workspace, timeout_s=timeout_s, env=env, network=network)
        try:
            result = await self.rt.sandbox.exec(request, on_output)
        except CairnError as exc:
            data.update(output="".join(collected) + f"\n[sandbox error: {exc.message}]", exit_code=None, duration_ms=0)
            await self._close_command(ctx, item, data, ItemStatus.FAILED)
            return
        tail = decoder.decode(b"", final=True)
        if tail:
            collected.append(tail)
        output = "".join(collected)
        if size > _MAX_ITEM_OUTPUT:
            output += f"{_TRUNCATION_NOTICE}[{size} characters in all]"
        if result.timed_out:
            output += f"\n[timed out after {timeout_s:g} s]"
        data.update(output=output, exit_code=result.exit_code, duration_ms=int(result.duration_s * 1000))
        await self._close_command(ctx, item, data, ItemStatus.COMPLETED if result.exit_code == 0 else ItemStatus.FAILED)

    async def _close_command(self, ctx: _TurnContext, item: ItemRecord, data: dict[str, Any], status: ItemStatus) -> None:
        async with self._write(ctx) as tx:
            done = await transition_item(tx.conn, item, status, data=data)
            tx.emit(item_event("done", done, done.output_index))
            ctx.remember(done)


def _output_delta(ctx: _TurnContext, item: ItemRecord, text: str) -> dict[str, Any]:
    return {
        "type": "agent.output.command_execution_output.delta",
        "session_id": ctx.session.id,
        "turn_id": ctx.turn.id,
        "item_id": item.id,
        "output_index": item.output_index,
        "delta": text,
    }


def _is_runnable(turn: TurnRecord | None, session: SessionRecord | None) -> bool:
    """The turn exists, is queued or running, and nobody asked to cancel it."""
    return (
        turn is not None and session is not None and turn.status in ("queued", "in_progress") and not turn.cancel_requested
    )


def _decode_arguments(raw: Any) -> Mapping[str, Any]:
    if isinstance(raw, Mapping):
        return raw
    try:
        decoded = json.loads(raw) if isinstance(raw, str) else None
    except json.JSONDecodeError:
        decoded = None
    return decoded if isinstance(decoded, dict) else {}


def _add_usage(total: Mapping[str, Any] | None, step: Usage) -> dict[str, int]:
    base = dict(total or {})
    return {
        "input_tokens": int(base.get("input_tokens", 0)) + step.input_tokens,
        "output_tokens": int(base.get("output_tokens", 0)) + step.output_tokens,
        "cached_tokens": int(base.get("cached_tokens", 0)) + step.cached_tokens,
        "reasoning_tokens": int(base.get("reasoning_tokens", 0)) + step.reasoning_tokens,
    }
