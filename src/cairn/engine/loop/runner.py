"""The agent loop: runs one turn for a claimed job until it completes, fails, is cancelled,
or waits.

First what the turn's last job left: after a crash, recovery closes what cannot run again;
then the calls still open (held ones that were released, reads to run again, client calls)
go through the pipeline. Then step after step (`Step`): if a call of a step is deferred (a
retry's backoff), the job is handed back to be claimed again after the delay, by any
worker, which takes the call up again; if calls of a step are held, the turn waits
(`cairn.engine.loop.waiting`) and the job ends; a step without calls completes the turn. Beside the steps run a watch for cancellation, which stops the step where it is,
and the periodic flush of stream deltas. A worker that drains (`stopping`) ends the turn's
run at the next step boundary: the step is recorded, and the job is handed back at once for
any worker to go on from the database. Every exit leaves the job completed, handed back, or
leased to this worker until its lease runs out (a lost lease: another worker owns it now).
"""

from __future__ import annotations

import logging

import anyio

from cairn.engine.artifacts import collect_outputs, record_outputs
from cairn.engine.lifecycle import close_turn
from cairn.engine.loop.begin import TurnStart, begin_turn
from cairn.engine.loop.recorder import TurnRecorder
from cairn.engine.loop.recovery import recover_open_items
from cairn.engine.loop.step import Step
from cairn.engine.loop.waiting import wait_for_holds
from cairn.engine.runtime import Runtime
from cairn.engine.vaults.workspace import redact_workspace
from cairn.errors import CairnError, LeaseLostError, ModelError, RunStateRefusedError, StateDeserializeError, StatusConflictError
from cairn.states import TurnStatus
from cairn.store.jobs import Job, complete_job, release_job
from cairn.store.sessions import get_session
from cairn.store.turns import get_turn

__all__ = ["TurnRunner"]

log = logging.getLogger(__name__)

_FLUSH_INTERVAL_S = 0.05


class TurnRunner:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    async def run(self, job: Job, stopping: anyio.Event | None = None) -> None:
        """Run the job's turn as far as it goes, or until `stopping` is set between two steps;
        every exit leaves the job completed, handed back or leased out."""
        start = await begin_turn(self.rt, job)
        if start is None:
            return
        # While the turn runs here, its credentials' values are taken out of everything this
        # process stores for the session and every line it logs.
        with self.rt.redactors.holding(start.session.id, start.secrets.known_values):
            await self._run(job, start, stopping)

    async def _run(self, job: Job, start: TurnStart, stopping: anyio.Event | None) -> None:
        recorder = TurnRecorder(self.rt.journal, job, start.session, start.turn, start.items)
        step = Step.of_turn(self.rt, start, recorder)
        try:
            failure: Exception | None = None
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._watch_cancel, recorder.turn.id, scope)
                    tg.start_soon(self._flush_deltas, recorder)
                    # Caught here, not outside: a task group would wrap it in an ExceptionGroup.
                    try:
                        await self._drive(start, step, stopping)
                    except Exception as exc:
                        failure = exc
                    tg.cancel_scope.cancel()
            if failure is not None:
                raise failure
            if scope.cancelled_caught:
                with anyio.CancelScope(shield=True):
                    await self._finish(start, recorder, TurnStatus.CANCELLED)
        except (LeaseLostError, StatusConflictError) as exc:
            log.warning("turn %s: another writer owns it now (%s)", recorder.turn.id, exc)
        except (ModelError, RunStateRefusedError, StateDeserializeError) as exc:
            # The model's failure, a pause refused, or stored state that does not open (design
            # invariant 6): the turn fails with its code, and nothing continues on that state.
            if isinstance(exc, RunStateRefusedError):
                log.warning("turn %s cannot pause: %s", recorder.turn.id, exc.message)
            elif isinstance(exc, StateDeserializeError):
                log.warning("turn %s failed: %s", recorder.turn.id, exc.message)
            with anyio.CancelScope(shield=True):
                await self._finish(start, recorder, TurnStatus.FAILED, error={"code": exc.code, "message": exc.message})
        except Exception as exc:
            log.exception("turn %s failed", recorder.turn.id)
            message = exc.message if isinstance(exc, CairnError) else f"internal error: {type(exc).__name__}"
            with anyio.CancelScope(shield=True):
                await self._finish(start, recorder, TurnStatus.FAILED, error={"code": "internal_error", "message": message})
        finally:
            await start.model.aclose()

    async def _drive(self, start: TurnStart, step: Step, stopping: anyio.Event | None) -> None:
        recorder = step.recorder
        if start.is_taken_over:
            async with recorder.write() as tx:
                for record in await recover_open_items(tx, recorder.turn, step.pipeline, step.call_in_flight):
                    recorder.remember(record)
        outcome = await step.run_calls(recorder.open_calls())
        while True:
            if outcome.deferred is not None:
                # Before any hold: a retry due in seconds does not wait for a person. The held
                # calls are asked again when the job comes back.
                log.info("turn %s: a call is deferred (%s); its job comes back in %.1f s", recorder.turn.id,
                         outcome.deferred.reason, outcome.deferred.delay_s)
                await self._hand_back(start, recorder, delay_s=outcome.deferred.delay_s)
                return
            if outcome.holds:
                await self._redact_workspace(start)
                async with recorder.write() as tx:
                    # The run's context goes with it while it waits (or nothing waits: refused).
                    await start.context.store(tx, self.rt.sealer, start.secrets.known_values)
                    if await wait_for_holds(tx, recorder.job, recorder.turn, outcome.holds):
                        return
                    # The client answered while the other calls ran: take its results.
                    await recorder.reload_history(tx)
            if stopping is not None and stopping.is_set():
                # Between two steps: everything done so far is recorded; the next worker goes on.
                log.info("turn %s: handing its job back at a step boundary (draining)", recorder.turn.id)
                await self._hand_back(start, recorder)
                return
            outcome = await step.run()
            if not outcome.has_calls:
                await self._complete(start, recorder)
                return

    async def _hand_back(self, start: TurnStart, recorder: TurnRecorder, *, delay_s: float = 0.0) -> None:
        """Store the run's context and hand the turn's job back for any worker to go on."""
        await self._redact_workspace(start)
        if not start.context.is_empty:
            async with recorder.write() as tx:
                await start.context.store(tx, self.rt.sealer, start.secrets.known_values)
        await release_job(self.rt.db, recorder.job, delay_s=delay_s)

    async def _redact_workspace(self, start: TurnStart) -> None:
        """Take the session's secret values out of what this execution wrote in its workspace,
        before it is published or persisted (`cairn.engine.vaults.workspace`): whenever the
        execution ends (completed, waiting, handed back, failed, cancelled), before the write
        that lets another execution of the session start."""
        session = start.session
        if session.environment["type"] == "none":
            return
        files = self.rt.environments.files(session.id)
        changed = await redact_workspace(files, start.secrets.known_values.redactor, since_ns=start.began_ns)
        if changed:
            log.warning("session %s: a secret value in the workspace was replaced by the marker in %s", session.id,
                        ", ".join(f"/workspace/{path}" for path in changed))

    async def _complete(self, start: TurnStart, recorder: TurnRecorder) -> None:
        async with self.rt.db.read() as conn:
            session = await get_session(conn, recorder.session.id)
        assert session is not None
        outputs = []
        if session.environment["type"] != "none":
            await self._redact_workspace(start)
            outputs = await collect_outputs(self.rt.environments.files(session.id), self.rt.blobs, session)
        async with recorder.write() as tx:
            await record_outputs(tx.conn, session, recorder.turn.id, outputs)
            await close_turn(tx, recorder.turn, TurnStatus.COMPLETED)
            await start.context.drop(tx, self.rt.sealer)
            await complete_job(tx.conn, recorder.job)

    async def _finish(self, start: TurnStart, recorder: TurnRecorder, status: TurnStatus, *, error: dict[str, str] | None = None) -> None:
        try:
            await self._redact_workspace(start)
        except Exception:  # the turn ends anyway; what is left is logged, for a person
            log.exception("session %s: its workspace could not be searched for secret values", start.session.id)
        try:
            async with recorder.write() as tx:
                await close_turn(tx, recorder.turn, status, error=error)
                await start.context.drop(tx, self.rt.sealer)
                await complete_job(tx.conn, recorder.job)
        except (LeaseLostError, StatusConflictError):
            log.warning("turn %s: lease lost before it could be marked %s", recorder.turn.id, status)

    async def _flush_deltas(self, recorder: TurnRecorder) -> None:
        while True:
            await anyio.sleep(_FLUSH_INTERVAL_S)
            if not recorder.has_deltas:
                continue
            try:
                # Shielded: deltas taken into a transaction must not be lost to a cancel.
                with anyio.CancelScope(shield=True):
                    async with recorder.write():
                        pass
            except LeaseLostError:
                return  # the loop's next write raises it where it is handled

    async def _watch_cancel(self, turn_id: str, scope: anyio.CancelScope) -> None:
        while True:
            async with self.rt.db.read() as conn:
                turn = await get_turn(conn, turn_id)
            if turn is None or turn.cancel_requested:
                scope.cancel()
                return
            await anyio.sleep(self.rt.settings.poll_interval_s)
