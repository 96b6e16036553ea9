"""The streaming loop: the async shell around ``pipeline.tracker.GroupTracker``.

The tracker decides everything; this shell moves messages into ``tracker.handle`` and carries
out the actions it returns (``pipeline.actions``), in order. One anyio task group owns every task:

* one **sample task** per rollout reads its engine stream and hands each event to the tracker
  as it comes; with an engine that multiplexes its streams (``pipeline.engines.mux``; the sim
  engine) and ``orchestrator.multiplex_streams`` on, one **stream task** (``_mux_loop``) hands
  over every event the engine has ready at once instead. What the tracker returns for them is
  scored (``Score``: off the event loop, unless the scorer is inline) and posted to the
  tracking loop (``Post``);
* the **tracking loop** (``_track``) takes each message of its inbox to the tracker and does
  what comes back: starts a sample (an engine stream and a sample task, or a multiplexer
  start), cancels one, trains on a batch, records a step, writes a checkpoint, stops;
* the **learner task** runs each ``Train`` through ``pipeline.learning.LearnerStep`` and posts
  its ``StepDone``. Generation and learning overlap; ``max_async_steps`` bounds how far ahead.
  On a ``VirtualClock`` (the simulator) learning takes no engine time, so each batch is trained
  inline the moment it fills: same results, and reproducible runs.

Streams are bounded (``orchestrator.stream_buffer``; the tracker hands the learner at most one
batch besides the one training), so a slow learner or reward function back-pressures generation
instead of growing memory. A cancelled sample's cleanup aborts its engine request under a
shielded scope, so no request is orphaned.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.actions import (
    LEARNER_SLOTS,
    Cancel,
    Checkpoint,
    CloseEpisode,
    EnvStep,
    Evaluate,
    ForkEpisode,
    Post,
    Record,
    Score,
    ShellSettings,
    Start,
    Stop,
    Train,
    cannot_carry_out,
)
from pipeline.collector import fewer_collections
from pipeline.config.sections import OrchestratorConfig
from pipeline.engines.mux import StreamMux, multiplexer_of
from pipeline.learning import LearnerStep
from pipeline.messages import (
    EngineEvents,
    RewardsCounted,
    SampleDone,
    Started,
    StepDone,
    StopRequested,
    StreamCut,
    StreamFailed,
    StreamsClosed,
    Tick,
    TurnDone,
)
from pipeline.metrics import Budget, NullMetricsWriter
from pipeline.parts import RunOutputs, RunParts
from pipeline.tracker import GroupTracker
from pipeline.types import SampleFinished, SampleRequest, ScoredSample, TokenDelta

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


class Orchestrator:
    """Runs ``config.steps`` learner steps of online RL; see the module docstring.

    ``parts`` are the run's working parts, ``outputs`` where it writes (read when the run
    starts, so a caller may attach them after ``restore``). ``railgate.build.build_orchestrator``
    wires one from a run config.
    """

    def __init__(
        self,
        parts: RunParts,
        config: OrchestratorConfig,
        outputs: RunOutputs | None = None,
        *,
        seed: int = 0,
        run_id: str = "run",
    ):
        self.parts = parts
        self.engine = parts.engine
        self.config = config
        self.outputs = outputs if outputs is not None else RunOutputs()
        self.clock = parts.clock
        self._inline_learner = self.clock.learner_timing.trains_inline
        checkpoint_every = self.outputs.checkpoint_every if self.outputs.checkpoint is not None else 0
        self.tracker = GroupTracker(
            parts.gate,
            parts.controller,
            config,
            seed=seed,
            run_id=run_id,
            trace=self.outputs.trace,
            hook_timer=self.outputs.hook_timer,
            now=self.clock.now,
            policy_version=lambda: parts.engine.policy_version,
            shell=ShellSettings(self.clock.learner_timing, parts.evaluator is not None, checkpoint_every),
            lifecycle=parts.lifecycle,
            prompts_left=parts.prompts_left,
        )
        self.learn = LearnerStep(parts, self.outputs)
        self._scopes: dict[str, anyio.CancelScope] = {}  # running sample tasks by request id
        self._mux: StreamMux | None = None  # the engine's multiplexer, when the stream task drives the samples
        self._tg: TaskGroup | None = None
        self._inbox: MemoryObjectSendStream | None = None
        self._batches: MemoryObjectSendStream | None = None
        self._stop_requested = False  # request_stop: stop at the next step boundary, with a checkpoint
        self._stop_sent = False
        self._stopped = False

    @property
    def budget(self) -> Budget:
        return self.tracker.budget

    @property
    def evals(self) -> list[dict[str, float]]:
        return self.tracker.evals

    def restore(self, state: dict[str, Any]) -> None:
        """Continue a run from a checkpoint's state (before ``run``; outside an event loop): the
        tracker's part (gate and controller included), then the learner's and the engine's weights."""
        self.tracker.load_state_dict(state)
        self.learn.restore(state["learner"])
        self.parts.scoring.health.carry(self.tracker.reward_counts())  # reward counts go on from the checkpoint's

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
        if self.outputs.trace is not None:
            self.tracker.attach_trace(self.outputs.trace)  # the sink attached since construction
        await self.learn.score_references(in_thread=not self._inline_learner)  # the first prompts' scores
        inbox_send, inbox_recv = anyio.create_memory_object_stream[Any](self.config.stream_buffer)
        # The tracking loop never blocks on this stream: the tracker hands the learner at most
        # LEARNER_SLOTS batches, the one training and the one this stream holds.
        batch_send, batch_recv = anyio.create_memory_object_stream[Train](LEARNER_SLOTS - 1)
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
        tracker = self.tracker
        tracker.handle(RewardsCounted(self.parts.scoring.health.report()))  # right even when no learner step ran
        return RunSummary(
            steps=tracker.steps_done,
            budget=tracker.budget,
            evals=tracker.evals,
            stop_reason=tracker.stop_reason,
            wall_s=time.monotonic() - started,
            controller_metrics=dict(tracker.controller.metrics()),
        )

    async def _run_tasks(self, inbox_send, inbox_recv, batch_send, batch_recv) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._inbox = inbox_send
            self._batches = batch_send
            if not self._inline_learner:
                tg.start_soon(self._learner_loop, batch_recv, inbox_send.clone())
            self._mux = multiplexer_of(self.engine) if self.config.multiplex_streams else None
            if self._mux is not None:
                tg.start_soon(self._mux_loop, self._mux, inbox_send, name="streams")
            await self._track(inbox_recv)
            tg.cancel_scope.cancel()

    # --- the tracking loop ---------------------------------------------------------------

    async def _track(self, inbox: MemoryObjectReceiveStream) -> None:
        tracker = self.tracker
        async with inbox, self._batches:
            await self._act(tracker.handle(Started()))
            await self._act(tracker.handle(Tick(0)))
            while not self._stopped:
                if self._stop_requested and not self._stop_sent:
                    self._stop_sent = True
                    msg: Any = StopRequested()
                elif tracker.decisions_queued and inbox.statistics().current_buffer_used:
                    msg = inbox.receive_nowait()  # held groups are decided within this tick
                else:
                    msg = await inbox.receive()
                if msg is None:
                    continue  # request_stop's wake-up
                await self._act(tracker.handle(msg))
                await self._act(tracker.handle(Tick(inbox.statistics().current_buffer_used)))
                if type(msg) is SampleDone or type(msg) is TurnDone:
                    # The hold its sample's end took: the gate has acted and the tick has launched
                    # what the freed room allows, at this engine time.
                    self.clock.release()

    async def _act(self, actions) -> None:
        """Carry out what the tracker returned, in order."""
        for action in actions:
            kind = type(action)
            if kind is Start:
                self._start(action)
            elif kind is Cancel:
                self._cancel(action.request_id)
            elif kind is Train:
                if self._inline_learner:  # learning takes no engine time: the step happens now
                    await self._act(self.tracker.handle(await self.learn(action, in_thread=False)))
                else:
                    self._batches.send_nowait(action)  # room: the tracker counts the learner's batches
            elif kind is Record:
                self._record(action.step, action.metrics)
            elif kind is Checkpoint:
                self._checkpoint(action)
            elif kind is ForkEpisode:
                self.parts.episodes.fork(action.source, action.turns, action.key)
            elif kind is CloseEpisode:
                self.parts.episodes.close(action.key)
            elif kind is Evaluate:
                await self._act(self.tracker.handle(await self.learn.evaluate(action.step)))
            elif kind is Stop:
                self._stopped = True
            else:
                raise cannot_carry_out("the tracking loop", action)

    def _record(self, step: int, metrics: dict[str, Any]) -> None:
        writer = self.outputs.metrics if self.outputs.metrics is not None else NullMetricsWriter()
        writer.write(step, metrics)
        if self.outputs.on_step is not None and step > 0:  # step 0: the evaluation before training, no step
            self.outputs.on_step(step, metrics)

    def _checkpoint(self, action: Checkpoint) -> None:
        """Everything needed to resume after the step just finished: the tracker's state at that
        moment and the learner's (taken after the step, or now when the learner is idle)."""
        learner = (
            action.learner_state if action.learner_state is not None else copy.deepcopy(self.learn.learner.state_dict())
        )
        self.outputs.checkpoint({**action.state, "learner": learner})

    def _start(self, start: Start) -> None:
        request = start.request
        if self._mux is not None:
            self._mux.start(request)
            return
        events = self.engine.stream(request)  # registers the request now, before the task runs
        scope = self._scopes[request.request_id] = anyio.CancelScope()
        # A fixed name: anyio would otherwise build one from the function per task.
        self._tg.start_soon(self._sample_task, request, events, scope, name="sample")

    def _cancel(self, request_id: str) -> None:
        if self._mux is not None:
            self._mux.abort(request_id)
            return
        scope = self._scopes.get(request_id)
        if scope is not None:
            scope.cancel()

    # --- the stream side: a task per sample ----------------------------------------------

    async def _sample_task(self, request: SampleRequest, events, scope: anyio.CancelScope) -> None:
        # The inbox is shared, not cloned per sample: the tracking loop stops on the tracker's
        # Stop, never on the inbox closing, and a clone per rollout is measurable overhead.
        message = None
        with scope:
            message = await self._consume(request, events)
        del self._scopes[request.request_id]
        if message is not None:  # None: cancelled, and the tracker was told (StreamCut)
            await self._stream_actions(self.tracker.handle(message), held=True)

    async def _consume(self, request: SampleRequest, events) -> SampleFinished | StreamFailed:
        """Hand each delta to the tracker; return the final event, or a ``StreamFailed`` when the
        engine failed (either with the clock held: time stands still until the tracker has acted
        on the sample). A cancelled sample's cleanup aborts it in the engine and tells the
        tracker what its stream still produced."""
        tracker, rid = self.tracker, request.request_id
        final = None
        try:
            async for event in events:
                if type(event) is TokenDelta:
                    actions = tracker.handle(event)
                    if actions:
                        await self._stream_actions(actions)
                else:
                    self.clock.hold()
                    final = event
                    break
            if final is None:
                raise RuntimeError(f"engine {self.engine.name} ended stream {rid} without a SampleFinished")
            return final
        except anyio.get_cancelled_exc_class():
            tokens, last = await self._drain(rid, events)
            tracker.handle(StreamCut(rid, tokens, last))
            raise
        except Exception as exc:  # the engine failed on this sample; the run goes on
            tokens, last = await self._drain(rid, events)
            self.clock.hold()
            return StreamFailed(rid, f"{type(exc).__name__}: {exc}", tokens, last)
        finally:
            with anyio.CancelScope(shield=True):
                await events.aclose()

    async def _drain(self, request_id: str, events) -> tuple[int, SampleFinished | None]:
        """Abort a sample in the engine; the tokens and the final event its stream still brings."""
        tokens, final = 0, None
        with anyio.CancelScope(shield=True), anyio.move_on_after(_ABORT_GRACE_S):
            await self.engine.abort(request_id)
            try:
                async for event in events:
                    if type(event) is TokenDelta:
                        tokens += len(event.token_ids)
                    else:
                        final = event
                        break
            except Exception:
                pass  # the engine failed while aborting; the request is closed regardless
        return tokens, final

    async def _stream_actions(self, actions, held: bool = False) -> None:
        """Carry out the actions of a stream's event: score a finished sample and report it
        (it ``held`` the clock; a sample the tracker counts as aborted releases it), post the
        token hook's messages."""
        scored = False
        for action in actions:
            if type(action) is Score or type(action) is EnvStep:
                scored = True
                await self._report(action)
            elif type(action) is Post:
                await self._inbox.send(action.message)
            else:
                raise cannot_carry_out("a sample task", action)
        if held and not scored:
            self.clock.release()

    async def _report(self, action: Score | EnvStep) -> None:
        """Score a finished sample (or step an episode's environment with a finished turn) and
        send the answer to the tracking loop (which releases the clock hold its end took)."""
        try:
            if type(action) is EnvStep:
                answer = await self.parts.episodes.step(action.request, action.finished)
            else:
                answer = await self._scored(action.request, action.finished)
            await self._inbox.send(answer)
        except BaseException:
            self.clock.release()
            raise

    async def _scored(self, request: SampleRequest, finished: SampleFinished) -> SampleDone:
        if finished.finish_reason.is_success:
            # A branch's token_ids start with its source's prefix: the answer is all of them.
            reward, error = await self.parts.scoring.score(request.prompt, finished.token_ids)
        else:
            reward, error = 0.0, finished.error
        return SampleDone(ScoredSample(request, finished, reward, error))

    # --- the stream side: one task for a multiplexing engine ------------------------------

    async def _mux_loop(self, mux: StreamMux, inbox) -> None:
        """Hand every batch of ready events to the tracker at once; score what finished (inline,
        or in a short task of its own) and post it. The messages of one batch go to the tracking
        loop after the whole batch is read, as when the sample tasks woken at one engine time all
        run before it: the decision points of a tick then share one batch of RAIL decisions."""
        tracker, clock = self.tracker, self.clock
        report_inline = self.parts.scoring.runs_inline
        try:
            while True:
                messages: list[Any] = []
                for action in tracker.handle(EngineEvents(await mux.next_events())):
                    if type(action) is Score or type(action) is EnvStep:
                        clock.hold()  # time stands still until the tracker has acted on this sample
                        if report_inline and type(action) is Score:  # scored here, without suspending
                            messages.append(await self._scored(action.request, action.finished))
                        else:
                            self._tg.start_soon(self._report, action, name="reward")
                    elif type(action) is Post:
                        messages.append(action.message)
                    else:
                        raise cannot_carry_out("the stream task", action)
                for i, message in enumerate(messages):
                    try:
                        # All at once while there is room: the tracking loop then finds the tick's
                        # events waiting and decides their points together.
                        try:
                            inbox.send_nowait(message)
                        except anyio.WouldBlock:
                            await inbox.send(message)
                    except BaseException as exc:  # the holds of finished samples not sent are released
                        for unsent in messages[i:]:
                            if isinstance(unsent, (SampleDone, TurnDone)):
                                clock.release()
                        if isinstance(exc, (anyio.BrokenResourceError, anyio.ClosedResourceError)):
                            return  # the tracking loop has ended: the run is over
                        raise
        finally:
            tracker.handle(StreamsClosed(mux.close()))  # the run is over: what the running samples produced

    # --- learner task --------------------------------------------------------------------

    async def _learner_loop(self, batches: MemoryObjectReceiveStream, inbox: MemoryObjectSendStream) -> None:
        async with batches, inbox:
            async for train in batches:
                done: StepDone = await self.learn(train, in_thread=True)
                await inbox.send(done)
