"""The streaming loop: the async shell around ``pipeline.core.tracker.GroupTracker``.

The tracker decides everything; this shell moves messages into ``tracker.handle`` and carries
out the actions it returns (``pipeline.core.actions``), in order. One anyio task group owns every task:

* one **sample task** per rollout reads its engine stream and hands each event to the tracker
  as it comes; with an engine that multiplexes its streams (``pipeline.engines.mux``; the sim
  engine) and ``orchestrator.multiplex_streams`` on, one **stream task** (``_mux_loop``) hands
  over every event the engine has ready at once instead. What the tracker returns for them is
  scored (``Score``: off the event loop, unless the scorer is inline) and posted to the
  tracking loop (``Post``);
* the **tracking loop** (``_track``) takes each message of its inbox to the tracker and does
  what comes back: starts a sample (an engine stream and a sample task, or a multiplexer
  start), cancels one, trains on a batch, records a step, writes a checkpoint, stops;
* the **learner task** runs each ``Train`` through ``pipeline.shells.learning.LearnerStep`` and posts
  its ``StepDone``. Generation and learning overlap; ``max_async_steps`` bounds how far ahead.
  On a ``VirtualClock`` (the simulator) learning takes no engine time, so each batch is trained
  inline the moment it fills: same results, and reproducible runs. Which of the two the run
  does is a part its clock takes (``pipeline.shells.learner_timing.LEARNING_BY_CLOCK``), not a flag.

Each of these rooms carries actions out through a handler table declared once in this class
(``pipeline.shells.handlers``): the tracking loop's, a sample task's and the stream task's; each names
every action type, with a handler or a named refusal. A finished sample holds a virtual clock
from its final event until the tracking loop has ticked after its answer: the hold is a token
(``pipeline.clock.Hold``) that travels with the answer (``Held``) and ends in ``with`` blocks.

Streams are bounded (``orchestrator.stream_buffer``; the tracker hands the learner at most one
batch besides the one training), so a slow learner or reward function back-pressures generation
instead of growing memory. A cancelled sample's cleanup aborts its engine request under a
shielded scope, so no request is orphaned.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.clock import Held, Hold, end_holds
from pipeline.config.sections import OrchestratorConfig
from pipeline.core.actions import (
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
)
from pipeline.core.messages import (
    EngineEvents,
    RewardsCounted,
    SampleDone,
    Started,
    StopRequested,
    StreamCut,
    StreamFailed,
    StreamsClosed,
    Tick,
)
from pipeline.core.tracker import GroupTracker
from pipeline.engines.mux import StreamMux, multiplexer_of
from pipeline.metrics import Budget, NullMetricsWriter
from pipeline.shells.collector import fewer_collections
from pipeline.shells.handlers import HandlerTable, Refuse
from pipeline.shells.learner_timing import learning_for
from pipeline.shells.learning import LearnerStep
from pipeline.shells.parts import RunOutputs, RunParts
from pipeline.types import SampleFinished, SampleRequest, TokenDelta

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
        self.learning = learning_for(self.clock)  # the learner's timing: the part its clock takes
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
            shell=ShellSettings(self.learning.timing, parts.evaluator is not None, checkpoint_every),
            lifecycle=parts.lifecycle,
            prompts_left=parts.prompts_left,
        )
        self.learn = LearnerStep(parts, self.learning.run, self.outputs)
        self._scopes: dict[str, anyio.CancelScope] = {}  # running sample tasks by request id
        self._mux: StreamMux | None = None  # the engine's multiplexer, when the stream task drives the samples
        self._tg: TaskGroup | None = None
        self._inbox: MemoryObjectSendStream | None = None
        self._stop_requested = False  # request_stop: stop at the next step boundary, with a checkpoint
        self._stop_sent = False
        self._stopped = False
        self._stop_hold = _NO_HOLD  # the stop's hold on engine time, ended once every task has ended

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
        await self.learn.score_references()  # the first prompts' scores
        inbox_send, inbox_recv = anyio.create_memory_object_stream[Any](self.config.stream_buffer)
        try:
            with fewer_collections():
                await self._run_tasks(inbox_send, inbox_recv)
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

    async def _run_tasks(self, inbox_send, inbox_recv) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self._inbox = inbox_send
                self.learning.start(tg, self.learn, inbox_send)  # a learner task, when it trains beside generation
                self._mux = multiplexer_of(self.engine) if self.config.multiplex_streams else None
                if self._mux is not None:
                    tg.start_soon(self._mux_loop, self._mux, inbox_send, name="streams")
                await self._track(inbox_recv)
                tg.cancel_scope.cancel()
        finally:
            self._stop_hold.end()  # the stop's hold (``_stop``): every task has ended, the samples cut

    # --- the tracking loop ---------------------------------------------------------------

    async def _track(self, inbox: MemoryObjectReceiveStream) -> None:
        tracker = self.tracker
        async with inbox:
            try:
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
                    hold = _NO_HOLD
                    if type(msg) is Held:  # a finished sample's answer, holding the clock
                        msg, hold = msg
                    with hold:  # it ends after the tick: the gate has acted and the tick has
                        # launched what the freed room allows, at this engine time
                        await self._act(tracker.handle(msg))
                        await self._act(tracker.handle(Tick(inbox.statistics().current_buffer_used)))
            finally:
                self.learning.close()

    async def _act(self, actions) -> None:
        """Carry out what the tracker returned, in order (``_TRACKING``)."""
        handlers = self._TRACKING
        for action in actions:
            pending = handlers[type(action)](self, action)
            if pending is not None:
                await pending

    async def _answer(self, message: Any) -> None:
        """Hand the tracker the answer to an action carried out here, and carry out what it returns."""
        await self._act(self.tracker.handle(message))

    def _train(self, train: Train) -> Any:
        return self.learning.hand_over(train, self.learn, self._answer)

    async def _evaluate(self, evaluate: Evaluate) -> None:
        await self._answer(await self.learn.evaluate(evaluate.step))

    def _record(self, record: Record) -> None:
        step, metrics = record.step, record.metrics
        writer = self.outputs.metrics if self.outputs.metrics is not None else NullMetricsWriter()
        writer.write(step, metrics)
        if self.outputs.on_step is not None and step > 0:  # step 0: the evaluation before training, no step
            self.outputs.on_step(step, metrics)

    def _fork_episode(self, fork: ForkEpisode) -> None:
        self.parts.episodes.fork(fork.source, fork.turns, fork.key)

    def _close_episode(self, close: CloseEpisode) -> None:
        self.parts.episodes.close(close.key)

    def _stop(self, stop: Stop) -> None:
        if not self._stopped:
            # Engine time ends with the run: held until the task group is over, so every sample
            # still running is cut at the stop's time. Otherwise the clock moved on each time a
            # cancelled stream left it, and what the last ones were cut with hung on the order
            # anyio cancels tasks in (a set's: by memory address).
            self._stop_hold = self.clock.hold()
        self._stopped = True

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

    def _cancel(self, cancel: Cancel) -> None:
        request_id = cancel.request_id
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
        ended = None
        with scope:
            ended = await self._consume(request, events)
        del self._scopes[request.request_id]
        if ended is not None:  # None: cancelled, and the tracker was told (StreamCut)
            message, hold = ended
            with hold:  # it ends here unless its answer carried it on to the tracking loop
                await self._stream_actions(self.tracker.handle(message), hold)

    async def _consume(self, request: SampleRequest, events) -> tuple[SampleFinished | StreamFailed, Hold]:
        """Hand each delta to the tracker; return the final event, or a ``StreamFailed`` when the
        engine failed, with a hold on the clock (time stands still until the tracker has acted
        on the sample). A cancelled sample's cleanup aborts it in the engine and tells the
        tracker what its stream still produced."""
        tracker, rid = self.tracker, request.request_id
        final = None
        try:
            async for event in events:
                if type(event) is TokenDelta:
                    actions = tracker.handle(event)
                    if actions:
                        await self._stream_actions(actions, _NO_HOLD)
                else:
                    hold = self.clock.hold()
                    final = event
                    break
            if final is None:
                raise RuntimeError(f"engine {self.engine.name} ended stream {rid} without a SampleFinished")
            return final, hold
        except anyio.get_cancelled_exc_class():
            tokens, last = await self._drain(rid, events)
            tracker.handle(StreamCut(rid, tokens, last))
            raise
        except Exception as exc:  # the engine failed on this sample; the run goes on
            tokens, last = await self._drain(rid, events)
            return StreamFailed(rid, f"{type(exc).__name__}: {exc}", tokens, last), self.clock.hold()
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

    async def _stream_actions(self, actions, hold: Hold) -> None:
        """Carry out the actions of a stream's event (``_SAMPLE_TASK``): score a finished sample
        and report it (its answer carries on the ``hold`` its end took), post the token hook's
        messages."""
        handlers = self._SAMPLE_TASK
        for action in actions:
            await handlers[type(action)](self, action, hold)

    async def _post(self, post: Post, hold: Hold) -> None:
        with self._after_the_stop():
            await self._inbox.send(post.message)

    @contextlib.contextmanager
    def _after_the_stop(self):
        """A sample that ends after the run stopped has no tracking loop to tell: its message is
        dropped (the tracker counted the run's end already). Before the stop a closed inbox is a
        bug, and raises."""
        try:
            yield
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            if not self._stopped:
                raise

    async def _report(self, action: Score | EnvStep, hold: Hold) -> None:
        """Score a finished sample (or step an episode's environment with a finished turn) and
        send the answer to the tracking loop, with the ``hold`` its end took: the tracking loop
        ends it; a failure here ends it at once."""
        with hold:
            if type(action) is EnvStep:
                answer = await self.parts.episodes.step(action.request, action.finished)
            else:
                answer = await self._scored(action)
            with self._after_the_stop():
                await hold.hand_on(self._inbox.send, answer)

    async def _scored(self, score: Score) -> SampleDone:
        """A ``Score`` carried out: the reward of a completed sample, none for one that failed."""
        finished = score.finished
        if finished.finish_reason.is_success:
            # A branch's token_ids start with its source's prefix: the answer is all of them.
            reward, error = await self.parts.scoring.score(score.request.prompt, finished.token_ids)
        else:
            reward, error = 0.0, finished.error
        return score.answer(reward, error)

    # --- the stream side: one task for a multiplexing engine ------------------------------

    async def _mux_loop(self, mux: StreamMux, inbox) -> None:
        """Hand every batch of ready events to the tracker at once; score what finished (inline,
        or in a short task of its own) and post it. The messages of one batch go to the tracking
        loop after the whole batch is read, as when the sample tasks woken at one engine time all
        run before it: the decision points of a tick then share one batch of RAIL decisions."""
        tracker, handlers = self.tracker, self._STREAM_TASK
        try:
            while True:
                messages: list[Any] = []
                for action in tracker.handle(EngineEvents(await mux.next_events())):
                    pending = handlers[type(action)](self, action, messages)
                    if pending is not None:
                        await pending
                for i, message in enumerate(messages):
                    try:
                        # All at once while there is room: the tracking loop then finds the tick's
                        # events waiting and decides their points together.
                        try:
                            inbox.send_nowait(message)
                        except anyio.WouldBlock:
                            await inbox.send(message)
                    except BaseException as exc:  # the holds of finished samples not sent end
                        end_holds(messages[i:])
                        if isinstance(exc, (anyio.BrokenResourceError, anyio.ClosedResourceError)):
                            return  # the tracking loop has ended: the run is over
                        raise
        finally:
            tracker.handle(StreamsClosed(mux.close()))  # the run is over: what the running samples produced

    def _mux_score(self, score: Score, messages: list) -> Any:
        """Hold the clock until the tracker has acted on this sample (the hold goes with its
        answer); score it here when the scorer runs inline (without suspending), else in a
        short task of its own."""
        if self.parts.scoring.runs_inline:
            return self._mux_score_inline(score, self.clock.hold(), messages)
        self._tg.start_soon(self._report, score, self.clock.hold(), name="reward")
        return None

    async def _mux_score_inline(self, score: Score, hold: Hold, messages: list) -> None:
        messages.append(Held(await self._scored(score), hold))

    def _mux_env_step(self, step: EnvStep, messages: list) -> None:
        self._tg.start_soon(self._report, step, self.clock.hold(), name="reward")

    def _mux_post(self, post: Post, messages: list) -> None:
        messages.append(post.message)

    # --- the handler tables, one per room ------------------------------------------------

    _STREAM_SIDE = "a stream's event's action: a sample task or the stream task carries it out"
    _TRACKING_SIDE = "the tracker returns it for the tracking loop's messages, never for a stream's events"
    _TRACKING = HandlerTable(
        "the tracking loop",
        {
            Start: _start,
            Cancel: _cancel,
            Train: _train,
            Record: _record,
            Checkpoint: _checkpoint,
            ForkEpisode: _fork_episode,
            CloseEpisode: _close_episode,
            Evaluate: _evaluate,
            Stop: _stop,
            (Score, EnvStep, Post): Refuse(_STREAM_SIDE),
        },
    )
    _TRACKING_LOOP_ACTIONS = (Start, Cancel, Train, Record, Checkpoint, ForkEpisode, CloseEpisode, Evaluate, Stop)
    _SAMPLE_TASK = HandlerTable(
        "a sample task",
        {Score: _report, EnvStep: _report, Post: _post, _TRACKING_LOOP_ACTIONS: Refuse(_TRACKING_SIDE)},
    )
    _STREAM_TASK = HandlerTable(
        "the stream task",
        {Score: _mux_score, EnvStep: _mux_env_step, Post: _mux_post, _TRACKING_LOOP_ACTIONS: Refuse(_TRACKING_SIDE)},
    )


_NO_HOLD = Hold(None)
"""The hold of a message that holds nothing (an inert token)."""
