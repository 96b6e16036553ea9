"""The streaming loop: admission -> engine streams -> rewards -> gate/controller -> learner.

One anyio task group owns every task:

* one **sample task** per rollout consumes its engine stream, feeds token deltas to the
  controller's token hook, scores the finished sample (``ScoringService``, off the event loop)
  and sends a ``SampleDone`` to the tracker;
* the **tracker** (this class's ``_tracker``) is the single writer of all group state: it calls
  ``gate.update`` and ``controller.on_group`` for each ``SampleDone``, executes their actions
  (launch, commit, abandon), ships finished committed groups into batches, and admits new
  groups while the step-ahead, open-group and concurrency limits allow;
* the **learner task** writes each ``TrainBatch`` to the Arrow buffer, runs the learner step in
  a worker thread, pushes the new weights into the engine, evaluates, and reports a ``StepDone``
  to the tracker. Generation and learning overlap; ``max_async_steps`` bounds how far ahead.
  On a ``VirtualClock`` (the simulator) learning takes no engine time, so the tracker trains
  each batch inline the moment it fills: same results, and reproducible runs.

Streams are bounded (``orchestrator.stream_buffer``; the batch stream holds
``max_async_steps`` batches), so a slow learner or reward function back-pressures generation
instead of growing memory. Abandoning a group cancels its samples' cancel scopes; each sample's
cleanup aborts its engine request under a shielded scope, so no request is orphaned.
"""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.clock import VirtualClock, WallClock
from pipeline.config import OrchestratorConfig
from pipeline.engines.base import Engine
from pipeline.group import GroupRun
from pipeline.metrics import Budget, MetricsWriter, NullMetricsWriter
from pipeline.protocols import Controller, DecisionSink, Evaluator, Gate, Learner
from pipeline.scoring import ScoringService
from pipeline.seeding import sample_seed
from pipeline.types import (
    ActionKind,
    BranchSpec,
    DecisionRecord,
    FinishReason,
    GroupAction,
    SampleFinished,
    SampleRequest,
    SamplingParams,
    ScoredSample,
    StepResult,
    TokenDelta,
    TrainBatch,
)

# How long a cancelled sample's cleanup may wait for the engine to confirm its abort.
_ABORT_GRACE_S = 5.0


class GateStalled(RuntimeError):
    """Nothing is running and the gate opens no group: the run cannot make progress."""


@dataclass(frozen=True)
class SampleDone:
    """Tracker inbox: a sample ended and was scored."""

    scored: ScoredSample
    new_tokens: int  # tokens the final event added beyond the streamed deltas


@dataclass(frozen=True)
class StepDone:
    """Tracker inbox: the learner finished a step."""

    batch: TrainBatch
    result: StepResult
    learner_state: dict | None = None  # taken between steps, when a checkpoint is due


@dataclass(frozen=True)
class ControllerActions:
    """Tracker inbox: actions the controller chose at a token-level decision point."""

    actions: tuple[GroupAction, ...]


@dataclass
class RunSummary:
    """What ``Orchestrator.run`` returns."""

    steps: int
    budget: Budget
    evals: list[dict[str, float]] = field(default_factory=list)
    stop_reason: str = ""
    wall_s: float = 0.0
    controller_metrics: dict[str, float] = field(default_factory=dict)
    """The controller's ``metrics()`` at the end (empty without a controller that has them)."""


class HookTimer:
    """Latency of the decision hooks (snapshot + gate.update + controller.on_group), kept in a
    bounded ring of the last ``capacity`` calls, in nanoseconds."""

    def __init__(self, capacity: int = 200_000):
        self.capacity = capacity
        self.samples: list[int] = []
        self.calls = 0

    def record(self, ns: int) -> None:
        if len(self.samples) < self.capacity:
            self.samples.append(ns)
        else:
            self.samples[self.calls % self.capacity] = ns
        self.calls += 1

    def percentile_us(self, q: float) -> float:
        if not self.samples:
            return math.nan
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] / 1000.0


class NullSink:
    """A ``DecisionSink`` that keeps nothing (decision ids still increase)."""

    def __init__(self) -> None:
        self._next = 0

    def next_decision_id(self) -> int:
        self._next += 1
        return self._next - 1

    def log_decision(self, record: DecisionRecord) -> None:
        return None

    def log_outcome(self, decision_id: int, reward: float, tokens: int) -> None:
        return None

    def watermark(self) -> int:
        return self._next

    def flush(self) -> None:
        return None


class Orchestrator:
    """Runs ``config.steps`` learner steps of online RL; see the module docstring.

    ``buffer`` (an ``ArrowBuffer``) is optional: with it every batch goes to disk and the
    learner trains on the batch read back from Arrow. ``on_step`` is called after each step
    with the step's metrics (progress bars, checkpoints).
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
        buffer: Any = None,
        trace: DecisionSink | None = None,
        metrics: MetricsWriter | NullMetricsWriter | None = None,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
        seed: int = 0,
        run_id: str = "run",
        start_step: int = 0,
        start_group_id: int = 0,
        budget: Budget | None = None,
        hook_timer: "HookTimer | None" = None,
        checkpoint: Callable[[dict[str, Any]], None] | None = None,
        checkpoint_every: int = 0,
        resume_state: dict[str, Any] | None = None,
    ):
        self.engine = engine
        self.gate = gate
        self.controller = controller
        self.scoring = scoring
        self.learner = learner
        self.config = config
        self.evaluator = evaluator
        self.clock = clock if clock is not None else WallClock()
        self.buffer = buffer
        self.trace = trace if trace is not None else NullSink()
        self.metrics = metrics if metrics is not None else NullMetricsWriter()
        self.on_step = on_step
        self.seed = seed
        self.run_id = run_id
        self.budget = budget if budget is not None else Budget()
        self.evals: list[dict[str, float]] = []
        self.hook_timer = hook_timer
        self._checkpoint = checkpoint
        self._checkpoint_every = checkpoint_every

        self._token_hooks = bool(getattr(controller, "wants_tokens", False))
        self._inline_learner = isinstance(self.clock, VirtualClock)
        self._default_params = SamplingParams(
            temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_tokens
        )
        self._groups: dict[int, GroupRun] = {}
        self._next_group_id = start_group_id
        self._launch_queue: deque[tuple[GroupRun, SamplingParams | None, BranchSpec | None, int]] = deque()
        self._in_flight = 0
        self._pending: list = []  # shipped CommittedGroups waiting to fill a batch
        self._sealed_open = 0  # open groups that are sealed (committed, still finishing)
        self._touched: set[int] = set()  # groups that may have become ready to ship
        self._start_step = start_step
        self._batches_sent = start_step
        self._steps_done = start_step
        self._stop_reason = ""
        self._tg: TaskGroup | None = None
        self._inbox: MemoryObjectSendStream | None = None
        self._step_started = self._run_started = time.monotonic()
        self._eval_wall_s = 0.0
        self._sent_untrained: deque[TrainBatch] = deque()  # sent to the learner, not trained yet
        if resume_state is not None:
            self._restore(resume_state)

    # --- public ------------------------------------------------------------------------

    @property
    def steps_done(self) -> int:
        return self._steps_done

    @property
    def next_group_id(self) -> int:
        return self._next_group_id

    @property
    def open_groups(self) -> int:
        return len(self._groups)

    async def run(self) -> RunSummary:
        started = time.monotonic()
        if self.evaluator is not None and self._steps_done == 0:
            self._record_eval(0, await self._evaluate(0))
        inbox_send, inbox_recv = anyio.create_memory_object_stream[Any](self.config.stream_buffer)
        # The tracker never blocks on this stream (send_nowait, retried after every message),
        # so a learner blocked on a full inbox cannot deadlock with it. The step-ahead limit
        # lives in _admit.
        batch_send, batch_recv = anyio.create_memory_object_stream[TrainBatch](1)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self._inbox = inbox_send
                if not self._inline_learner:
                    tg.start_soon(self._learner_loop, batch_recv, inbox_send.clone())
                await self._tracker(inbox_recv, batch_send)
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # One task failed and the rest were cancelled: surface that one error as itself.
            errors = [e for e in group.exceptions if not isinstance(e, anyio.get_cancelled_exc_class())]
            if len(errors) == 1 and isinstance(errors[0], Exception):
                raise errors[0] from None
            raise
        inbox_send.close()
        self._groups.clear()
        return RunSummary(
            steps=self._steps_done,
            budget=self.budget,
            evals=self.evals,
            stop_reason=self._stop_reason,
            wall_s=time.monotonic() - started,
            controller_metrics=dict(self.controller.metrics()) if callable(getattr(self.controller, "metrics", None)) else {},
        )

    # --- tracker -----------------------------------------------------------------------

    async def _tracker(self, inbox: MemoryObjectReceiveStream, batches: MemoryObjectSendStream) -> None:
        total_steps = self.config.steps
        async with inbox, batches:
            self._admit()
            while self._steps_done < total_steps and not self._stop_reason:
                self._check_progress_possible()
                if self._stop_reason:
                    break
                msg = await inbox.receive()
                if isinstance(msg, SampleDone):
                    try:
                        self._on_sample(msg)
                    finally:
                        self.clock.release()
                elif isinstance(msg, StepDone):
                    self._on_step_done(msg)
                elif isinstance(msg, ControllerActions):
                    self._execute(msg.actions, source="controller")
                self._ship_ready()
                if self._inline_learner:
                    await self._train_inline()
                else:
                    self._send_batches(batches)
                self._pump_launches()
                self._admit()
        if not self._stop_reason:
            self._stop_reason = "steps"

    async def _train_inline(self) -> None:
        """Virtual engine time: learning takes none of it, so each batch is trained at the very
        moment it fills, before anything else happens -- which also makes runs reproducible
        (a learner thread would finish at a wall-clock-dependent point between events)."""
        b = self.config.batch_groups
        while len(self._pending) >= b and self._batches_sent < self.config.steps and not self._stop_reason:
            batch = TrainBatch(step=self._batches_sent, groups=tuple(self._pending[:b]))
            del self._pending[:b]
            self._batches_sent += 1
            self._sent_untrained.append(batch)
            self._on_step_done(await self._learn(batch, in_thread=False))

    def _send_batches(self, batches: MemoryObjectSendStream) -> None:
        b = self.config.batch_groups
        while len(self._pending) >= b and self._batches_sent < self.config.steps:
            batch = TrainBatch(step=self._batches_sent, groups=tuple(self._pending[:b]))
            try:
                batches.send_nowait(batch)
            except anyio.WouldBlock:
                return  # the learner is busy; retried after the next message
            del self._pending[:b]
            self._batches_sent += 1
            self._sent_untrained.append(batch)

    def _check_progress_possible(self) -> None:
        """Stop (budget spent) or raise (gate stalled) instead of waiting forever when nothing
        can produce another message."""
        if self._in_flight or self._launch_queue or self._batches_sent > self._steps_done:
            return
        if len(self._pending) >= self.config.batch_groups:
            return
        if self._budget_spent():
            self._stop_reason = f"rollout budget of {self.config.max_rollouts} spent"
            return
        held = sum(1 for g in self._groups.values() if not g.in_flight)
        raise GateStalled(
            f"the gate ({type(self.gate).__name__}) opened no group while nothing is running "
            f"({len(self._groups)} open groups, {held} of them held with nothing in flight, "
            f"{len(self._pending)} committed groups waiting for a batch of {self.config.batch_groups}); "
            "the prompt pool may be exhausted or emptied by eviction -- add prompts, relax eviction, "
            "or lower orchestrator.batch_groups"
        )

    def _admit(self) -> None:
        cfg = self.config
        b = cfg.batch_groups
        # Every open group may still commit, so open groups count against the step-ahead limit.
        sealed_open = self._sealed_open
        committed_ahead = (self._batches_sent - self._steps_done) * b + len(self._pending) + len(self._groups)
        still_needed = cfg.steps * b - (self._batches_sent * b + len(self._pending) + sealed_open)
        if committed_ahead >= (cfg.max_async_steps + 1) * b or still_needed <= 0 or self._stop_reason:
            return
        if self._budget_spent():
            return
        free = cfg.max_concurrent_samples - self._in_flight - len(self._launch_queue)
        room = (cfg.max_async_steps + 1) * b - committed_ahead
        slots = min(cfg.max_open_groups - len(self._groups), free // cfg.group_size, room)
        if slots <= 0:
            return
        for plan in self.gate.admit(slots, self._batches_sent):
            group = GroupRun(self._next_group_id, plan.prompt, plan.target_size, self._batches_sent)
            self._next_group_id += 1
            self._groups[group.group_id] = group
            self.budget.groups_opened += 1
            self._enqueue(group, plan.initial, plan.params, None)
        self._pump_launches()

    def _budget_spent(self) -> bool:
        limit = self.config.max_rollouts
        # A benchmark-only gate (the oracle) may book some of its cost as uncounted.
        uncounted = getattr(self.gate, "uncounted_rollouts", 0)
        return bool(limit) and self.budget.rollouts_started - uncounted >= limit

    def _pump_launches(self) -> None:
        while self._launch_queue and self._in_flight < self.config.max_concurrent_samples:
            group, params, branch, origin = self._launch_queue.popleft()
            group.queued -= 1
            if group.closed:
                continue
            self._launch(group, params, branch, origin)

    def _enqueue(self, group: GroupRun, n: int, params: SamplingParams | None, branch: BranchSpec | None, origin: int = -1) -> None:
        for _ in range(n):
            self._launch_queue.append((group, params, branch, origin))
        group.queued += n

    def _launch(self, group: GroupRun, params: SamplingParams | None, branch: BranchSpec | None, origin: int = -1) -> None:
        index = group.launched
        base = params or self._default_params
        params = SamplingParams(base.temperature, base.top_p, base.max_tokens, sample_seed(self.seed, group.group_id, index))
        request = SampleRequest(
            request_id=f"g{group.group_id}-s{index}",
            group_id=group.group_id,
            sample_index=index,
            prompt=group.prompt,
            params=params,
            branch=branch,
            launch_time=self.clock.now(),
            origin=origin,
        )
        events = self.engine.stream(request)  # registers the request now, before the task runs
        scope = anyio.CancelScope()
        group.in_flight[request.request_id] = scope
        group.launched += 1
        self._in_flight += 1
        self.budget.rollouts_started += 1
        if origin >= 0:
            self.budget.rollouts_intervention += 1
        assert self._tg is not None and self._inbox is not None
        self._tg.start_soon(self._sample_task, group, request, events, scope, self._inbox)

    def _on_sample(self, msg: SampleDone) -> None:
        scored = msg.scored
        self._in_flight -= 1  # counted until the tracker has seen it, so a stall check cannot race it
        group = self._groups.get(scored.request.group_id)
        reason = scored.result.finish_reason
        if group is None or group.closed:
            return  # a straggler of an abandoned group: counted by its task, nothing to decide
        group.in_flight.pop(scored.request.request_id, None)
        if reason is FinishReason.ERROR:
            group.failed += 1
        elif reason is FinishReason.ABORTED:
            group.aborted += 1
        group.samples.append(scored)
        self._touched.add(group.group_id)
        started = time.perf_counter_ns() if self.hook_timer is not None else 0
        snapshot = group.snapshot(self.engine.policy_version)
        proposed = [] if group.sealed else self.gate.update(snapshot)
        final = self.controller.on_group(snapshot, proposed)
        if self.hook_timer is not None:
            self.hook_timer.record(time.perf_counter_ns() - started)
        for action in proposed:
            if action.group_id in self._groups:
                # The trace says what the gate proposed and whether it ran (the controller may
                # replace an abandon by an intervention).
                self._log_gate_decision(self._groups[action.group_id], action, executed=action in final)
        self._execute(final, source="gate")

    def _execute(self, actions: list[GroupAction] | tuple[GroupAction, ...], source: str) -> None:
        for action in actions:
            group = self._groups.get(action.group_id)
            if group is None and (source == "controller" or action.origin >= 0):
                # An intervention chosen at a token while the tracker was closing its group.
                self.budget.interventions_dropped += 1
                continue
            if group is None:
                raise RuntimeError(
                    f"{source} ({type(self.gate if source == 'gate' else self.controller).__name__}) "
                    f"acted on group {action.group_id}, which is not open; a gate may only act on groups it opened "
                    "and has not committed or abandoned"
                )
            if action.kind is ActionKind.LAUNCH:
                if group.sealed and action.origin < 0:
                    raise RuntimeError(
                        f"{source} launched {action.n} samples on sealed group {group.group_id}; "
                        "emit LAUNCH before COMMIT"
                    )
                self._enqueue(group, action.n, action.params, action.branch, action.origin)
            elif action.kind is ActionKind.COMMIT:
                if not group.sealed:
                    group.sealed = True
                    self._sealed_open += 1
                self._touched.add(group.group_id)
            elif action.kind is ActionKind.ABANDON:
                self._close(group, committed=False)
        self._pump_launches()

    def _ship_ready(self) -> None:
        touched, self._touched = self._touched, set()
        for group_id in touched:
            group = self._groups.get(group_id)
            if group is not None and group.sealed and not group.in_flight and not group.queued:
                self._close(group, committed=True)

    def _close(self, group: GroupRun, committed: bool) -> None:
        group.closed = True
        del self._groups[group.group_id]
        if group.sealed:
            self._sealed_open -= 1
        for scope in group.in_flight.values():
            scope.cancel()
        effective = False
        if committed:
            shipped = group.committed()
            if len(shipped.rollouts) < 2:
                self.budget.groups_dropped_empty += 1
                committed = False
            else:
                effective = shipped.is_effective
                self.budget.groups_committed += 1
                self.budget.groups_effective += int(effective)
                self._pending.append(shipped)
                self.controller.on_closed(shipped, group.snapshot(self.engine.policy_version))
        if not committed:
            self.budget.groups_abandoned += 1
            self.controller.on_closed(None, group.snapshot(self.engine.policy_version))
        self.gate.on_closed(group.group_id, committed)
        for decision_id in group.decision_ids:
            self.trace.log_outcome(decision_id, float(effective), group.tokens)

    def _log_gate_decision(self, group: GroupRun, action: GroupAction, executed: bool = True) -> None:
        decision_id = self.trace.next_decision_id()
        group.decision_ids.append(decision_id)
        rewards = group.rewards
        successes = sum(1 for r in rewards if r > group.prompt.success_threshold)
        self.trace.log_decision(
            DecisionRecord(
                decision_id=decision_id,
                time=self.clock.now(),
                run_id=self.run_id,
                mode="live",
                decision_point="gate",
                prompt_id=group.prompt.prompt_id,
                group_id=group.group_id,
                sample_index=-1,
                token_position=-1,
                features={
                    "successes": float(successes),
                    "failures": float(len(rewards) - successes),
                    "in_flight": float(len(group.in_flight)),
                    "launched": float(group.launched),
                    "target_size": float(group.target_size),
                    "executed": float(executed),
                },
                actions=("launch", "commit", "abandon", "hold"),
                chosen=action.kind.value,
                propensity=1.0,
                behaviour_propensity=1.0,
                predicted_gain=float("nan"),
                policy_version=self.engine.policy_version,
            )
        )

    def _on_step_done(self, msg: StepDone) -> None:
        self._steps_done = msg.batch.step + 1
        if self._sent_untrained and self._sent_untrained[0].step == msg.batch.step:
            self._sent_untrained.popleft()
        step_actions = self.gate.on_step(msg.batch.step, msg.batch)
        for action in step_actions:
            if action.group_id in self._groups:
                self._log_gate_decision(self._groups[action.group_id], action)
        self._execute(step_actions, source="gate")
        if msg.learner_state is not None and self._checkpoint is not None:
            self._checkpoint(self.state_dict(msg.learner_state))

    # --- checkpoints -------------------------------------------------------------------

    def _checkpoint_due(self, step: int) -> bool:
        every = self._checkpoint_every
        return self._checkpoint is not None and every > 0 and (step % every == 0 or step == self.config.steps)

    def state_dict(self, learner_state: dict[str, Any]) -> dict[str, Any]:
        """Everything needed to resume after the step just finished. Groups still open are
        listed so that a resumed run can tell the gate they are gone; committed groups not yet
        trained (pending, or in batches sent to the learner) are kept whole."""
        self.trace.flush()  # decisions before the checkpoint must be on disk with it
        return {
            "step": self._steps_done,
            "decision_watermark": self.trace.watermark(),
            "next_group_id": self._next_group_id,
            "budget": self.budget.state_dict(),
            "evals": list(self.evals),
            "open_group_ids": sorted(self._groups),
            "untrained_batches": [b.groups for b in self._sent_untrained],
            "pending": list(self._pending),
            "gate": self.gate.state_dict(),
            "controller": self.controller.state_dict(),
            "learner": learner_state,
            "policy_version": self.engine.policy_version,
        }

    def _restore(self, state: dict[str, Any]) -> None:
        self._steps_done = self._batches_sent = int(state["step"])
        self._next_group_id = int(state["next_group_id"])
        self.budget.load_state_dict(state["budget"])
        self.evals = list(state["evals"])
        # Committed groups that were never trained go first, in their original order.
        self._pending = [g for groups in state["untrained_batches"] for g in groups] + list(state["pending"])
        for group_id in state["open_group_ids"]:
            self.gate.on_closed(group_id, False)

    # --- sample task -------------------------------------------------------------------

    async def _sample_task(self, group: GroupRun, request: SampleRequest, events, scope: anyio.CancelScope, inbox) -> None:
        # The inbox is shared, not cloned per sample: the tracker stops on its step count,
        # never on the inbox closing, and a clone per rollout is measurable overhead.
        finished: SampleFinished | None = None
        streamed = [0]
        with scope:
            try:
                finished = await self._consume(group, request, events, streamed, inbox)
            except Exception as exc:  # the engine failed on this sample; the run goes on
                self.clock.hold()
                finished = SampleFinished(
                    request_id=request.request_id, token_ids=(), logprobs=(),
                    finish_reason=FinishReason.ERROR, policy_version=self.engine.policy_version,
                    error=f"{type(exc).__name__}: {exc}",
                )
        if finished is None:
            self._in_flight -= 1
            return  # cancelled: the group was abandoned (cleanup already accounted the sample)
        reason = finished.finish_reason
        if reason is FinishReason.ABORTED:
            self.budget.rollouts_aborted += 1
        elif reason is FinishReason.ERROR:
            self.budget.rollouts_failed += 1
        else:
            self.budget.rollouts_finished += 1
        prefix = request.branch.prefix_len if request.branch else 0
        extra = max(0, finished.num_tokens - prefix - streamed[0])
        self.budget.tokens_generated += extra
        group.tokens += extra
        try:
            if finished.finish_reason.is_success:
                # A branch's token_ids start with its source's prefix: the answer is all of them.
                reward, error = await self.scoring.score(request.prompt, finished.token_ids)
            else:
                reward, error = 0.0, finished.error
            await inbox.send(SampleDone(ScoredSample(request, finished, reward, error), extra))
        except BaseException:
            self.clock.release()
            raise

    async def _consume(self, group: GroupRun, request: SampleRequest, events, streamed: list[int], inbox) -> SampleFinished | None:
        finished = None
        cancelled = False
        try:
            async for event in events:
                if type(event) is TokenDelta:
                    n = len(event.token_ids)
                    streamed[0] += n
                    group.tokens += n
                    self.budget.tokens_generated += n
                    if self._token_hooks and not group.closed:
                        actions = self.controller.on_tokens(group.snapshot(self.engine.policy_version), request.sample_index, event)
                        if actions:
                            await inbox.send(ControllerActions(tuple(actions)))
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
                await self._abort_and_account(group, request, events, streamed, cancelled)
                with anyio.CancelScope(shield=True):
                    await events.aclose()
            else:
                await events.aclose()

    async def _abort_and_account(self, group: GroupRun, request: SampleRequest, events, streamed: list[int], cancelled: bool) -> None:
        """Cleanup of a cancelled or failed sample: abort it in the engine and count what it produced."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(_ABORT_GRACE_S):
            await self.engine.abort(request.request_id)
            try:
                async for event in events:
                    if type(event) is TokenDelta:
                        streamed[0] += len(event.token_ids)
                        self.budget.tokens_generated += len(event.token_ids)
                    else:
                        prefix = request.branch.prefix_len if request.branch else 0
                        extra = max(0, event.num_tokens - prefix - streamed[0])
                        self.budget.tokens_generated += extra
                        break
            except Exception:
                pass  # the engine failed while aborting; the request is closed below regardless
        if cancelled:  # a failure is counted by the caller, as a failed sample
            self.budget.rollouts_aborted += 1
            group.aborted += 1

    # --- learner task ------------------------------------------------------------------

    async def _learner_loop(self, batches: MemoryObjectReceiveStream, inbox: MemoryObjectSendStream) -> None:
        async with batches, inbox:
            async for batch in batches:
                await inbox.send(await self._learn(batch, in_thread=True))

    async def _learn(self, batch: TrainBatch, in_thread: bool) -> StepDone:
        """One learner step on ``batch``: buffer, step, new weights, evaluation, metrics."""
        self.budget.tokens_trained += sum(g.trained_tokens for g in batch.groups)  # before the buffer drops it
        if in_thread:
            if self.buffer is not None:
                batch = await anyio.to_thread.run_sync(self._through_buffer, batch)
            result = await anyio.to_thread.run_sync(self.learner.step, batch)
        else:
            if self.buffer is not None:
                batch = self._through_buffer(batch)
            result = self.learner.step(batch)
        await self.engine.update_weights(self.learner.weights())
        metrics = self._step_metrics(batch, result)
        step = batch.step + 1
        # A deep copy now, before the next step starts mutating the weights in its thread.
        learner_state = copy.deepcopy(self.learner.state_dict()) if self._checkpoint_due(step) else None
        if self.evaluator is not None and (
            step == self.config.steps or (self.config.eval_every and step % self.config.eval_every == 0)
        ):
            evaluation = await self._evaluate(step)
            metrics.update(evaluation)
            self._record_eval(step, evaluation)
        self.metrics.write(step, metrics)
        if self.on_step is not None:
            self.on_step(step, metrics)
        return StepDone(batch, result, learner_state)

    def _through_buffer(self, batch: TrainBatch) -> TrainBatch:
        record_batch = self.buffer.put(batch)
        return self.buffer.to_train_batch(record_batch)

    def _step_metrics(self, batch: TrainBatch, result: StepResult) -> dict[str, float]:
        version = self.engine.policy_version
        stale = [version - 1 - r.policy_version for g in batch.groups for r in g.rollouts]
        b = self.budget
        b.rollouts_trained += len(stale)
        b.staleness_sum += sum(stale)
        b.staleness_max = max(b.staleness_max, max(stale, default=0))
        b.reward_errors = self.scoring.errors
        b.reward_timeouts = self.scoring.timeouts
        b.rewards_none = self.scoring.no_reward
        now = time.monotonic()
        metrics = {
            **b.as_metrics(),
            **result.metrics,
            "pipeline/step_staleness_max": float(max(stale, default=0)),
            "pipeline/batch_effective_fraction": sum(g.is_effective for g in batch.groups) / max(1, len(batch.groups)),
            "pipeline/open_groups": float(len(self._groups)),
            "pipeline/engine_time": float(self.clock.now()),
            "pipeline/step_wall_s": now - self._step_started,
            "engine/policy_version": float(version),
        }
        self._step_started = now
        for part in (self.gate, self.controller):
            extra = getattr(part, "metrics", None)
            if callable(extra):
                metrics.update(extra())
        return metrics

    async def _evaluate(self, step: int) -> dict[str, float]:
        started = time.monotonic()
        evaluation = await self.evaluator.evaluate(step)
        self._eval_wall_s += time.monotonic() - started
        return evaluation

    def _record_eval(self, step: int, evaluation: dict[str, float]) -> None:
        b = self.budget
        gate_metrics = getattr(self.gate, "metrics", None)
        # eval/wall_s_total: evaluation's share of the wall clock (benchmarks subtract it).
        record = {"step": float(step), "pipeline/rollouts_started": float(b.rollouts_started),
                  "pipeline/tokens_generated": float(b.tokens_generated), "pipeline/engine_time": float(self.clock.now()),
                  "pipeline/wall_s": time.monotonic() - self._run_started,  # of this process (a resume restarts it)
                  "eval/wall_s_total": self._eval_wall_s,
                  **(gate_metrics() if callable(gate_metrics) else {}), **evaluation}
        self.evals.append(record)
        target = self.config.target_accuracy
        accuracy = evaluation.get("eval/accuracy", math.nan)
        if target and accuracy >= target and not self._stop_reason:
            self._stop_reason = f"target accuracy {target} reached at step {step}"
