"""The streaming loop: admission -> engine streams -> rewards -> gate/controller -> learner.

This module is the async shell around ``pipeline.tracker.GroupTracker``, which holds every
group's state and decides (with the gate and the controller) what to launch, cancel and train.
One anyio task group owns every task:

* one **sample task** per rollout consumes its engine stream, counts its token deltas (and
  passes them to the controller's token hook) through the tracker, scores the finished sample
  (``ScoringService``, off the event loop) and sends a ``SampleDone`` to the tracking loop.
  With an engine that multiplexes its streams (``pipeline.engines.mux``; the sim engine) and
  ``orchestrator.multiplex_streams`` on, one **stream task** does the same for every running
  sample instead (``_mux_loop``): the engine hands it the events ready at once, and only a
  reward that runs off the event loop gets a task of its own, from the sample's end;
* the **tracking loop** (``_track``) feeds each message to the tracker and carries out what it
  returns at once: an engine stream and a sample task per launch, a cancelled scope per
  cancel. It ships committed groups, hands full batches to the learner and admits new groups;
* the **learner task** runs each ``TrainBatch`` through ``pipeline.learning.LearnerStep``
  (buffer, learner step in a worker thread, new weights into the engine, metrics, evaluation)
  and reports a ``StepDone``. Generation and learning overlap; ``max_async_steps`` bounds how
  far ahead. On a ``VirtualClock`` (the simulator) learning takes no engine time, so each batch
  is trained inline the moment it fills: same results, and reproducible runs.

Streams are bounded (``orchestrator.stream_buffer``; the batch stream holds one batch besides
the one being trained), so a slow learner or reward function back-pressures generation instead
of growing memory. Abandoning a group cancels its samples' scopes; each sample's cleanup aborts
its engine request under a shielded scope, so no request is orphaned.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.clock import VirtualClock, WallClock
from pipeline.collector import fewer_collections
from pipeline.config.sections import OrchestratorConfig
from pipeline.decisions import NullSink  # noqa: F401  (re-exported: older imports name it here)
from pipeline.engines.base import Engine
from pipeline.engines.mux import StreamMux, multiplexer_of
from pipeline.group import GroupRun
from pipeline.hooktimer import HookTimer
from pipeline.inbox import ControllerActions, DecideQueued, SampleDone, StepDone
from pipeline.learning import LearnerStep
from pipeline.metrics import Budget, MetricsWriter, NullMetricsWriter
from pipeline.protocols import Buffer, Controller, DecisionSink, Evaluator, Gate, Learner, ReferenceScores
from pipeline.tasks.rewards.scoring import ScoringService
from pipeline.tracker import GateStalled, GroupTracker, TrackerOutput  # noqa: F401  (GateStalled re-exported)
from pipeline.types import FinishReason, SampleFinished, SampleRequest, ScoredSample, TokenDelta, TrainBatch

# How long a cancelled sample's cleanup may wait for the engine to confirm its abort.
_ABORT_GRACE_S = 5.0


@dataclass
class RunSummary:
    """What ``Orchestrator.run`` returns."""

    steps: int
    budget: Budget
    evals: list[dict[str, float]] = field(default_factory=list)
    stop_reason: str = ""
    wall_s: float = 0.0
    controller_metrics: dict[str, float] = field(default_factory=dict)
    """The controller's ``metrics()`` at the end."""


class _MuxRun:
    """A sample the stream task drives: its group, its request, the tokens its deltas carried,
    and whether its group was abandoned (its remaining events count as its abort's)."""

    __slots__ = ("group", "request", "streamed", "cancelled")

    def __init__(self, group: GroupRun, request: SampleRequest):
        self.group, self.request = group, request
        self.streamed = 0
        self.cancelled = False


class Orchestrator:
    """Runs ``config.steps`` learner steps of online RL; see the module docstring.

    ``buffer`` (an ``ArrowBuffer``) is optional: with it every trained batch goes to disk. ``on_step``
    is called after each step with the step's metrics (progress bars). ``checkpoint`` is called
    with ``state_dict`` every ``checkpoint_every`` steps; ``resume_state`` (such a dict)
    continues a run. ``reference`` (``gate.sara.reference_prior``) gets the learner's likelihoods
    of the next prompts' reference responses at the start and after every step.
    ``railgate.build.build_orchestrator`` wires one from a run config.
    """

    def __init__(
        self,
        *,
        engine: Engine,
        gate: Gate,
        controller: Controller,
        scoring: ScoringService,
        learner: Learner,
        config: OrchestratorConfig,
        evaluator: Evaluator | None = None,
        clock: VirtualClock | WallClock | None = None,
        buffer: Buffer | None = None,
        trace: DecisionSink | None = None,
        metrics: MetricsWriter | NullMetricsWriter | None = None,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
        seed: int = 0,
        run_id: str = "run",
        hook_timer: HookTimer | None = None,
        checkpoint: Callable[[dict[str, Any]], None] | None = None,
        checkpoint_every: int = 0,
        resume_state: dict[str, Any] | None = None,
        reference: ReferenceScores | None = None,
    ):
        self.engine = engine
        self.config = config
        self.scoring = scoring
        self.clock = clock if clock is not None else WallClock()
        self.tracker = GroupTracker(
            gate, controller, config, seed=seed, run_id=run_id, trace=trace, hook_timer=hook_timer,
            now=self.clock.now, policy_version=lambda: engine.policy_version,
        )
        self.learn = LearnerStep(
            learner, engine, self.tracker, config, clock=self.clock, scoring=scoring, evaluator=evaluator,
            buffer=buffer, metrics=metrics, on_step=on_step, checkpoint_due=self._checkpoint_due, reference=reference,
        )
        self._checkpoint = checkpoint
        self._checkpoint_every = checkpoint_every
        self._inline_learner = isinstance(self.clock, VirtualClock)
        self._scopes: dict[str, anyio.CancelScope] = {}  # running sample tasks by request id
        self._mux: StreamMux | None = None  # the engine's multiplexer, when the stream task drives the samples
        self._mux_runs: dict[str, _MuxRun] = {}  # its running samples by request id
        self._tg: TaskGroup | None = None
        self._inbox: MemoryObjectSendStream | None = None
        self._stop_requested = False  # request_stop: stop at the next step boundary, with a checkpoint
        self._at_learner = 0  # batches sent to the learner task and not yet reported done
        if resume_state is not None:
            self.tracker.load_state_dict(resume_state)
            self.learn.evals = list(resume_state["evals"])

    @property
    def budget(self) -> Budget:
        return self.tracker.budget

    @property
    def evals(self) -> list[dict[str, float]]:
        return self.learn.evals

    def request_stop(self) -> None:
        """Stop at the next point where the learner is idle (the step in training, if any, is
        finished first), with a checkpoint there when checkpoints are on; the run then ends
        with ``stop_reason == "interrupted"``. Called from the event loop (Ctrl-C's handler)."""
        self._stop_requested = True
        if self._inbox is not None:
            try:
                self._inbox.send_nowait(None)  # wake the tracking loop
            except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # a full inbox wakes it anyway

    async def run(self) -> RunSummary:
        started = time.monotonic()
        tracker = self.tracker
        if self.learn.evaluator is not None and tracker.steps_done == 0:
            self.learn.record_eval(0, await self.learn.evaluate(0))
        await self.learn.score_references(in_thread=not self._inline_learner)  # the first prompts' scores
        inbox_send, inbox_recv = anyio.create_memory_object_stream[Any](self.config.stream_buffer)
        # The tracking loop never blocks on this stream (send_nowait, retried after every
        # message), so a learner blocked on a full inbox cannot deadlock with it. The
        # step-ahead limit lives in GroupTracker.admit.
        batch_send, batch_recv = anyio.create_memory_object_stream[TrainBatch](1)
        try:
            with fewer_collections():
                await self._run_tasks(inbox_send, inbox_recv, batch_send, batch_recv)
        except BaseExceptionGroup as group:
            # One task failed and the rest were cancelled: surface that one error as itself.
            errors = [e for e in group.exceptions if not isinstance(e, anyio.get_cancelled_exc_class())]
            if len(errors) == 1 and isinstance(errors[0], Exception):
                raise errors[0] from None
            raise
        inbox_send.close()
        return RunSummary(
            steps=tracker.steps_done, budget=tracker.budget, evals=self.learn.evals, stop_reason=tracker.stop_reason,
            wall_s=time.monotonic() - started, controller_metrics=dict(tracker.controller.metrics()),
        )

    async def _run_tasks(self, inbox_send, inbox_recv, batch_send, batch_recv) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._inbox = inbox_send
            if not self._inline_learner:
                tg.start_soon(self._learner_loop, batch_recv, inbox_send.clone())
            self._mux = multiplexer_of(self.engine) if self.config.multiplex_streams else None
            if self._mux is not None:
                tg.start_soon(self._mux_loop, self._mux, inbox_send, name="streams")
            await self._track(inbox_recv, batch_send)
            tg.cancel_scope.cancel()

    # --- the tracking loop ---------------------------------------------------------------

    async def _track(self, inbox: MemoryObjectReceiveStream, batches: MemoryObjectSendStream) -> None:
        tracker, total_steps = self.tracker, self.config.steps
        async with inbox, batches:
            self._do(tracker.admit())
            while tracker.steps_done < total_steps and not tracker.stop_reason:
                if self._stop_requested and (self._inline_learner or not self._at_learner):
                    self._stop_with_checkpoint()
                    break
                tracker.check_progress()
                if tracker.stop_reason:
                    break
                if tracker.decisions_queued and inbox.statistics().current_buffer_used:
                    msg = inbox.receive_nowait()  # no checkpoint: held groups are decided within this tick
                else:
                    msg = await inbox.receive()
                if isinstance(msg, SampleDone):
                    try:
                        self._do(tracker.on_sample(msg.scored))
                    finally:
                        self.clock.release()
                elif isinstance(msg, StepDone):
                    self._at_learner -= 1
                    self._on_step_done(msg)
                elif isinstance(msg, ControllerActions):
                    self._do(tracker.on_controller_actions(msg.actions))
                # A DecideQueued only wakes the loop: queued decision points are decided once
                # the events already waiting are handled, so that a tick's points share a batch.
                if tracker.decisions_queued and tracker.decide_due(inbox.statistics().current_buffer_used):
                    self._do(tracker.on_decide_queued())
                self._do(tracker.ship_ready())
                if self._inline_learner:
                    await self._train_inline()
                else:
                    self._send_batches(batches)
                self._do(tracker.pump())
                self._do(tracker.admit())
        if not tracker.stop_reason:
            tracker.stop_reason = "steps"

    def _do(self, out: TrackerOutput) -> None:
        """Carry out what the tracker returned: cancel scopes, start sample tasks (or, with a
        multiplexer, abort and start its requests)."""
        if self._mux is not None:
            self._do_multiplexed(out, self._mux)
            return
        for request_id in out.cancels:
            scope = self._scopes.get(request_id)
            if scope is not None:
                scope.cancel()
        for launch in out.launches:
            events = self.engine.stream(launch.request)  # registers the request now, before the task runs
            scope = self._scopes[launch.request.request_id] = anyio.CancelScope()
            # A fixed name: anyio would otherwise build one from the function per task.
            self._tg.start_soon(self._sample_task, launch.group, launch.request, events, scope, self._inbox, name="sample")

    async def _train_inline(self) -> None:
        """Virtual engine time: learning takes none of it, so each batch is trained at the very
        moment it fills, before anything else happens -- which also makes runs reproducible
        (a learner thread would finish at a wall-clock-dependent point between events)."""
        tracker = self.tracker
        while not tracker.stop_reason and not self._stop_requested and (batch := tracker.next_batch()) is not None:
            tracker.batch_sent(batch)
            self._on_step_done(StepDone(*await self.learn(batch, in_thread=False)))

    def _send_batches(self, batches: MemoryObjectSendStream) -> None:
        while not self._stop_requested and (batch := self.tracker.next_batch()) is not None:
            try:
                batches.send_nowait(batch)
            except anyio.WouldBlock:
                return  # the learner is busy; retried after the next message
            self.tracker.batch_sent(batch)
            self._at_learner += 1

    def _on_step_done(self, msg: StepDone) -> None:
        self._do(self.tracker.on_step_done(msg.batch))
        if msg.learner_state is not None and self._checkpoint is not None:
            self._checkpoint(self.state_dict(msg.learner_state))

    # --- checkpoints ---------------------------------------------------------------------

    def _checkpoint_due(self, step: int) -> bool:
        every = self._checkpoint_every
        return self._checkpoint is not None and every > 0 and (step % every == 0 or step == self.config.steps)

    def _stop_with_checkpoint(self) -> None:
        """``request_stop``'s end: the learner is idle, so its state is the last finished step's."""
        if self._checkpoint is not None:
            self._checkpoint(self.state_dict(copy.deepcopy(self.learn.learner.state_dict())))
        self.tracker.stop_reason = "interrupted"

    def state_dict(self, learner_state: dict[str, Any]) -> dict[str, Any]:
        """Everything needed to resume after the step just finished (``GroupTracker.state_dict``,
        the evaluations so far and the learner's state)."""
        return {**self.tracker.state_dict(), "evals": list(self.learn.evals), "learner": learner_state}

    # --- sample task ---------------------------------------------------------------------

    async def _sample_task(self, group: GroupRun, request: SampleRequest, events, scope: anyio.CancelScope, inbox) -> None:
        # The inbox is shared, not cloned per sample: the tracking loop stops on its step
        # count, never on the inbox closing, and a clone per rollout is measurable overhead.
        tracker = self.tracker
        finished: SampleFinished | None = None
        streamed = [0]
        with scope:
            try:
                finished = await self._consume(group, request, events, streamed, inbox)
            except Exception as exc:  # the engine failed on this sample; the run goes on
                self.clock.hold()
                finished = self._failed(request, exc)
        del self._scopes[request.request_id]
        if finished is None:
            tracker.sample_gone()
            return  # cancelled: the group was abandoned (cleanup already accounted the sample)
        tracker.sample_ended(group, request, finished, streamed[0])
        await self._report(request, finished, inbox)

    async def _report(self, request: SampleRequest, finished: SampleFinished, inbox) -> None:
        """Score a finished sample and send it to the tracking loop (which releases the clock
        hold its end took)."""
        try:
            await inbox.send(await self._scored(request, finished))
        except BaseException:
            self.clock.release()
            raise

    async def _scored(self, request: SampleRequest, finished: SampleFinished) -> SampleDone:
        if finished.finish_reason.is_success:
            # A branch's token_ids start with its source's prefix: the answer is all of them.
            reward, error = await self.scoring.score(request.prompt, finished.token_ids)
        else:
            reward, error = 0.0, finished.error
        return SampleDone(ScoredSample(request, finished, reward, error))

    def _failed(self, request: SampleRequest, exc: BaseException) -> SampleFinished:
        """The final event of a sample the engine failed on."""
        return SampleFinished(
            request_id=request.request_id, token_ids=(), logprobs=(), finish_reason=FinishReason.ERROR,
            policy_version=self.engine.policy_version, error=f"{type(exc).__name__}: {exc}",
        )

    async def _consume(self, group: GroupRun, request: SampleRequest, events, streamed: list[int], inbox) -> SampleFinished | None:
        tracker = self.tracker
        finished = None
        cancelled = False
        try:
            async for event in events:
                if type(event) is TokenDelta:
                    streamed[0] += len(event.token_ids)
                    actions = tracker.on_tokens(group, request.sample_index, event)
                    if actions:
                        await inbox.send(ControllerActions(tuple(actions)))
                    elif tracker.flush_wanted():  # decided when the tracking loop next runs
                        await inbox.send(DecideQueued())
                else:
                    self.clock.hold()  # time stands still until the tracker has acted on this sample
                    finished = event
                    break
            if finished is None:
                raise RuntimeError(f"engine {self.engine.name} ended stream {request.request_id} without a SampleFinished")
            return finished
        except anyio.get_cancelled_exc_class():
            cancelled = True
            raise
        finally:
            if finished is None:
                await self._abort(group, request, events, streamed, cancelled)
                with anyio.CancelScope(shield=True):
                    await events.aclose()
            else:
                await events.aclose()

    async def _abort(self, group: GroupRun, request: SampleRequest, events, streamed: list[int], cancelled: bool) -> None:
        """Cleanup of a cancelled or failed sample: abort it in the engine and count what it produced."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(_ABORT_GRACE_S):
            await self.engine.abort(request.request_id)
            try:
                async for event in events:
                    if type(event) is TokenDelta:
                        streamed[0] += len(event.token_ids)
                        self.tracker.abort_tokens(request, len(event.token_ids))
                    else:
                        self.tracker.abort_tokens(request, final=event, streamed=streamed[0])
                        break
            except Exception:
                pass  # the engine failed while aborting; the request is closed below regardless
        if cancelled:  # a failure is counted by the caller, as a failed sample
            self.tracker.sample_cancelled(group)

    # --- the stream task (a multiplexing engine) ------------------------------------------

    def _do_multiplexed(self, out: TrackerOutput, mux: StreamMux) -> None:
        runs = self._mux_runs
        for request_id in out.cancels:
            run = runs.get(request_id)
            if run is not None and not run.cancelled:
                run.cancelled = True
                mux.abort(request_id)
        for launch in out.launches:
            runs[launch.request.request_id] = _MuxRun(launch.group, launch.request)
            mux.start(launch.request)

    async def _mux_loop(self, mux: StreamMux, inbox) -> None:
        """What the sample tasks do, for every running sample: count deltas (the controller's
        token hook), score each finished sample and report it; a cancelled sample's events are
        counted as its abort's. The messages of one batch of events go to the tracking loop after
        the whole batch is read, as when the sample tasks woken at one engine time all run before
        it: the decision points of a tick then share one batch of RAIL decisions."""
        tracker, runs, clock = self.tracker, self._mux_runs, self.clock
        report_inline = self.scoring.runs_inline
        try:
            while True:
                messages: list[Any] = []
                for request_id, event in await mux.next_events():
                    run = runs.get(request_id)
                    if run is None:
                        continue
                    if type(event) is TokenDelta:
                        n = len(event.token_ids)
                        run.streamed += n
                        if run.cancelled:
                            tracker.abort_tokens(run.request, n)
                            continue
                        actions = tracker.on_tokens(run.group, run.request.sample_index, event)
                        if actions:
                            messages.append(ControllerActions(tuple(actions)))
                        continue
                    del runs[request_id]
                    if run.cancelled and not (isinstance(event, SampleFinished) and event.finish_reason.is_success):
                        # Aborted (or failed) after its group was abandoned. One that ended in the
                        # engine before the abort reached it is a finished sample, as with a task
                        # per sample: the tracker drops it as a straggler.
                        self._count_abort(run, event if isinstance(event, SampleFinished) else None)
                        continue
                    clock.hold()  # time stands still until the tracker has acted on this sample
                    finished = event if isinstance(event, SampleFinished) else self._failed(run.request, event)
                    tracker.sample_ended(run.group, run.request, finished, run.streamed)
                    if report_inline:  # scored here, without suspending
                        messages.append(await self._scored(run.request, finished))
                    else:
                        self._tg.start_soon(self._report, run.request, finished, inbox, name="reward")
                if tracker.flush_wanted():  # decided when the tracking loop next runs
                    messages.append(DecideQueued())
                for i, message in enumerate(messages):
                    try:
                        # All at once while there is room: the tracking loop then finds the tick's
                        # events waiting and decides their points together (decide_due).
                        try:
                            inbox.send_nowait(message)
                        except anyio.WouldBlock:
                            await inbox.send(message)
                    except BaseException as exc:  # the holds of finished samples not sent are released
                        for unsent in messages[i:]:
                            if isinstance(unsent, SampleDone):
                                clock.release()
                        if isinstance(exc, (anyio.BrokenResourceError, anyio.ClosedResourceError)):
                            return  # the tracking loop has ended: the run is over
                        raise
        finally:
            for final in mux.close():  # the run is over: count what the running samples produced
                run = runs.pop(final.request_id, None)
                if run is not None:
                    self._count_abort(run, final)

    def _count_abort(self, run: _MuxRun, final: SampleFinished | None) -> None:
        """A sample ended by an abort (its group abandoned, or the run over): the tokens its
        final event adds, the aborted sample, its engine slot freed."""
        if final is not None:
            self.tracker.abort_tokens(run.request, final=final, streamed=run.streamed)
        self.tracker.sample_cancelled(run.group)
        self.tracker.sample_gone()

    # --- learner task --------------------------------------------------------------------

    async def _learner_loop(self, batches: MemoryObjectReceiveStream, inbox: MemoryObjectSendStream) -> None:
        async with batches, inbox:
            async for batch in batches:
                await inbox.send(StepDone(*await self.learn(batch, in_thread=True)))
