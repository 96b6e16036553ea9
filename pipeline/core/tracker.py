"""The group tracker: a state machine that takes one message and returns what to do.

``GroupTracker.handle(message)`` is the whole interface. The messages (``pipeline.core.messages``)
are the run's events: tokens arrived, a rollout finished, its reward was scored, the learner
finished a step, an evaluation came back. The actions it returns (``pipeline.core.actions``) are all
that happens in the world: start or cancel a sample, score one, post a message to the tracking
loop, evaluate, train on a batch, record a step's metrics, write a checkpoint, stop. The tracker
never awaits and knows no event loop, engine or learner; the async shell
(``pipeline.shells.orchestrator``) and the gate harness (``tests/gate_harness.py``) only move messages
in and carry actions out, in order, so the same lifecycle runs under both.

Inside, it is the single writer of every group's state and of the run's ``Budget``: it opens
groups through ``gate.admit``, queues their launches under the concurrency limit, asks
``gate.update`` and ``controller.on_group`` about every scored sample, executes the actions
they return (launch, commit, abandon), ships committed groups into batches, books each learner
step (``pipeline.core.steplog``), decides when to evaluate, checkpoint and stop, and checkpoints all
of it. Every sample has one record in its sample table (``pipeline.core.samples.Samples``), from
queued to done; the stream side (token deltas, final events, aborts) is counted by its
``pipeline.core.ledger.SampleLedger``.

>>> from controller.gates.uniform import UniformGate; from controller.noop import NoopController
>>> from controller.prompts import PromptPool; from pipeline.config.sections import OrchestratorConfig
>>> from pipeline.core.messages import SampleDone, Started, Tick
>>> from pipeline.types import FinishReason, Prompt, SampleFinished, ScoredSample
>>> pool = PromptPool([Prompt(i, "", (1,)) for i in range(8)], seed=0)
>>> cfg = OrchestratorConfig(batch_groups=1, group_size=2, steps=2, max_concurrent_samples=4, max_open_groups=2)
>>> tracker = GroupTracker(UniformGate(pool, 2), NoopController(), cfg)
>>> starts = [*tracker.handle(Started()), *tracker.handle(Tick())]
>>> [a.request.request_id for a in starts]                        # two groups of two, one per step
['g0-s0', 'g0-s1', 'g1-s0', 'g1-s1']
>>> for a in starts[:2]:                                          # group 0's samples end and are scored
...     [score] = tracker.handle(SampleFinished(a.request.request_id, (7,), (0.0,), FinishReason.STOP, 0))
...     _ = tracker.handle(SampleDone(ScoredSample(score.request, score.finished, reward=1.0)))
...     actions = tracker.handle(Tick())
>>> [(type(a).__name__, a.batch.step, [g.group_id for g in a.batch.groups]) for a in actions]
[('Train', 0, [0])]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from pipeline.config.sections import OrchestratorConfig
from pipeline.core.actions import (
    Action,
    Cancel,
    Checkpoint,
    Evaluate,
    Post,
    Record,
    ShellSettings,
    Start,
    Stop,
    Train,
)
from pipeline.core.admission import Occupancy, admit, open_slots, stall_error
from pipeline.core.batches import StepCutter
from pipeline.core.deciding import Deciders
from pipeline.core.group import GroupRun, checked, closing_from_state, closing_state
from pipeline.core.hooktimer import HookTimer
from pipeline.core.ledger import STREAM_MESSAGES, SampleLedger
from pipeline.core.lifecycles import Lifecycle, SingleTurn
from pipeline.core.messages import (
    ControllerActions,
    CutStep,
    DecideQueued,
    EngineEvents,
    Evaluated,
    RewardCounts,
    RewardsCounted,
    SampleDone,
    Started,
    StepDone,
    StopRequested,
    Tick,
    TurnDone,
)
from pipeline.core.samples import Requests, Samples
from pipeline.core.steplog import StepLog
from pipeline.metrics import Budget
from pipeline.protocols import Controller, DecisionSink, Gate
from pipeline.types import (
    ActionKind,
    CommittedGroup,
    GroupAction,
    ScoredSample,
    TokenDelta,
)

_NONE: tuple = ()  # what most calls return: no allocation


PROMPTS_EXHAUSTED = "prompts exhausted"
"""The stop reason of a run over a finite prompt source (``prompts_left``) once it has handed out
every prompt and nothing can run any more (held groups stay open; committed groups short of a
batch stay untrained): a replay's end."""


class GroupTracker:
    """Group state, admission, actions, batches, budget and step accounting of one run; see the
    module docstring. ``now`` and ``policy_version`` read the engine's clock and weights version
    (launch times, snapshots, trace records); both default to constants for engine-free use."""

    def __init__(
        self,
        gate: Gate,
        controller: Controller,
        config: OrchestratorConfig,
        *,
        seed: int = 0,
        run_id: str = "run",
        trace: DecisionSink | None = None,
        hook_timer: HookTimer | None = None,
        now: Callable[[], float] = lambda: 0.0,
        policy_version: Callable[[], int] = lambda: 0,
        shell: ShellSettings = ShellSettings(),
        lifecycle: Lifecycle | None = None,
        prompts_left: Callable[[], int] | None = None,
    ):
        self.gate, self.controller, self.config, self.shell = gate, controller, config, shell
        self.prompts_left = prompts_left  # a finite prompt source (replay); None: an endless one
        self.seed, self.run_id = seed, run_id
        self.now, self.policy_version = now, policy_version
        self.samples = Samples(config.max_concurrent_samples)  # one record per sample, from queued to done
        self._groups: dict[int, GroupRun] = {}  # the open groups: their one record each
        self.deciders = Deciders(
            gate,
            controller,
            self.samples,
            self._groups,
            run_id=run_id,
            hook_timer=hook_timer,
            now=now,
            policy_version=policy_version,
        )
        self.attach_trace(trace)
        self.budget = Budget()
        self.stop_reason = ""
        self.batches = StepCutter(config.batch_groups, config.batch_rollouts)  # committed groups -> batches
        self.steplog = StepLog(self.budget, config)
        self.requests = Requests(config, seed, now)
        self.lifecycle = lifecycle if lifecycle is not None else SingleTurn()  # or episodes of turns
        self.ledger = SampleLedger(self.samples, self.budget, controller, policy_version, self.lifecycle)
        self._next_group_id = 0
        self._sealed_open = 0  # open groups that are sealed (committed, still finishing)
        self._touched: set[int] = set()  # groups that may have become ready to ship
        self._steps_done = 0
        self._out: list[Action] = []
        self._stop_requested = False
        self._stopped = False

    def attach_trace(self, trace: DecisionSink | None) -> None:
        """Where gate decisions and outcomes go from now on (None: nowhere)."""
        self.deciders.attach_trace(trace)
        self.trace = self.deciders.trace

    # --- what the caller reads -----------------------------------------------------------

    @property
    def pending(self) -> list[CommittedGroup]:
        """Committed groups waiting to fill a batch, in order."""
        return self.batches.pending

    @property
    def steps_done(self) -> int:
        return self._steps_done

    @property
    def evals(self) -> list[dict[str, float]]:
        """Every evaluation record so far (``pipeline.core.steplog``)."""
        return self.steplog.evals

    @property
    def groups(self) -> Mapping[int, GroupRun]:
        """The open groups by id (read-only)."""
        return MappingProxyType(self._groups)

    def group(self, group_id: int) -> GroupRun | None:
        """The open group ``group_id`` (None once it closed)."""
        return self._groups.get(group_id)

    def reward_counts(self) -> RewardCounts:
        """The reward counts its budget holds (after ``load_state_dict``: the checkpoint's), for
        the scoring service to carry on from."""
        return self.steplog.reward_counts()

    @property
    def decisions_queued(self) -> int:
        """Decision points the controller queued and has not decided yet (the shell reads its
        next message without waiting while there are some, so that a tick's points share a batch)."""
        return self.deciders.queued

    # --- the one entry point -------------------------------------------------------------

    def handle(self, msg: Any) -> Sequence[Action]:
        """Take one message; return the actions to carry out, in order (the module docstring).
        The tracking loop follows each of its messages with a ``Tick``."""
        kind = type(msg)
        out = self._out
        if kind in STREAM_MESSAGES:  # the stream side: counted, and scored or posted to the tracking loop
            self.ledger.handle(msg, out)
            if (kind is EngineEvents or (kind is TokenDelta and not out)) and self.deciders.flush_wanted():
                out.append(Post(DecideQueued()))  # one wake-up for the decision points they queued
        elif kind is Tick:  # the tracking loop's messages
            self._tick(msg.backlog)
        elif kind is SampleDone:
            self._on_sample(msg.scored)
        elif kind is TurnDone:
            self._on_turn(msg)
        elif kind is ControllerActions:
            self._execute(msg.actions, source="controller")
        elif kind is StepDone:
            self._on_step_done(msg)
            self.shell.learner.after_step(self._from_batches)  # inline: the rest of the tick the batch interrupted
        elif kind is Started:
            if self.shell.evaluates and self._steps_done == 0 and not self.evals:
                out.append(Evaluate(0))
        elif kind is Evaluated:
            self._on_evaluated(msg.step, msg.evaluation, msg.timing)
            if msg.step == 0:  # the evaluation before training: step 0 of the metrics, where a curve starts
                self._out.append(Record(0, {**self.budget.as_metrics(), **msg.evaluation}))
        elif kind is StopRequested:
            self._stop_requested = True
        elif kind is CutStep:
            out.append(Train(self.batches.cut(), False, False))
        elif kind is RewardsCounted:
            self.steplog.count_rewards(msg.rewards)
        elif kind is not DecideQueued:  # a DecideQueued only wakes the loop
            raise TypeError(
                f"GroupTracker.handle got a {kind.__name__}; it takes the messages of pipeline.core.messages"
            )
        return self._take()

    def _take(self) -> Sequence[Action]:
        out = self._out
        if not out:
            return _NONE
        self._out = []
        return out

    # --- one tick of the tracking loop -----------------------------------------------------

    def _tick(self, backlog: int) -> None:
        """After a message: decide queued points when due, ship, hand batches to the learner,
        launch, admit, and see whether the run is over."""
        if self.deciders.queued and self.deciders.decide_due(backlog):
            self._execute(self.deciders.decide_queued(), source="controller")
        self._ship_ready()
        self._from_batches()

    def _from_batches(self) -> None:
        cfg = self.config
        handed_out = False
        while not self.stop_reason and not self._stop_requested and self._learner_room():
            batch = self.batches.next_batch(cfg.steps)
            if batch is None:
                break
            self.batches.sent(batch)
            step = batch.step + 1
            evaluate = self.shell.evaluates and (step == cfg.steps or (cfg.eval_every and step % cfg.eval_every == 0))
            self._out.append(Train(batch, bool(evaluate), self._checkpoint_due(step)))
            handed_out = True
        if handed_out:
            self.shell.learner.after_train(self._rest_of_tick)  # inline: nothing else until its StepDone
        else:
            self._rest_of_tick()

    def _rest_of_tick(self) -> None:
        self._pump()
        self._admit()
        self._check_end()

    def _learner_room(self) -> bool:
        in_hands = self.batches.batches_sent - self._steps_done
        return in_hands < self.shell.learner.slots

    def _checkpoint_due(self, step: int) -> bool:
        every = self.shell.checkpoint_every
        return every > 0 and (step % every == 0 or step == self.config.steps)

    def _check_end(self) -> None:
        if self._stopped:
            return
        if not self.stop_reason and self._steps_done >= self.config.steps:
            self.stop_reason = "steps"
        if not self.stop_reason and self._stop_requested and self.batches.batches_sent == self._steps_done:
            if self.shell.checkpoint_every:  # the learner is idle: its state is the last finished step's
                self._out.append(Checkpoint(self.state_dict(), None))
            self.stop_reason = "interrupted"
        if not self.stop_reason:
            self._check_progress()
        if self.stop_reason:
            self._stopped = True
            self.budget.rollouts_aborted += self.lifecycle.stop(self.samples, self._out)
            self._out.append(Stop(self.stop_reason))

    # --- admission and launches ----------------------------------------------------------

    def _admit(self) -> None:
        """Open the groups the gate wants while the limits of ``pipeline.core.admission`` leave room."""
        if self.stop_reason or self.budget_spent():
            return
        free = self.config.max_concurrent_samples - self.samples.started - len(self.samples)
        sent = self.batches.batches_sent
        occupancy = Occupancy(
            sent - self._steps_done, len(self.pending), len(self._groups), self._sealed_open, free, sent
        )
        slots = open_slots(self.config, occupancy, abandons=self.gate.abandons)
        if slots <= 0:
            return
        for group, plan in admit(self.gate, self._next_group_id, slots, sent):
            self._next_group_id += 1
            self._groups[group.group_id] = group
            self.budget.groups_opened += 1
            self.samples.queue(group, plan.initial, plan.params, None)
        self._pump()

    def budget_spent(self) -> bool:
        limit = self.config.max_rollouts
        # A benchmark-only gate (the oracle) may book some of its cost as uncounted.
        return bool(limit) and self.budget.rollouts_started - self.gate.uncounted_rollouts >= limit

    def _pump(self) -> None:
        """Start queued samples while the concurrency limit allows (an episode: its first turn)."""
        while (sample := self.samples.next_queued()) is not None:
            request = self.requests.make(sample, sample.group.launch())
            self.budget.rollouts_started += 1
            if sample.origin >= 0:
                self.budget.rollouts_intervention += 1
            request = self.lifecycle.start(request, self._out)  # an episode: its first turn
            self.samples.start(sample, request)
            self._out.append(Start(request))

    # --- decisions -----------------------------------------------------------------------

    def _on_sample(self, scored: ScoredSample) -> None:
        """A sample ended and was scored: the gate and the controller decide; their actions run."""
        self.samples.finish(scored.request.request_id)  # running until the tracker has seen it
        self._decide_on(scored)

    def _decide_on(self, scored: ScoredSample) -> None:
        group = self._groups.get(scored.request.group_id)
        if group is None or group.closed:
            return  # a straggler of an abandoned group
        group.count_end(scored.result.finish_reason)
        group.add(scored)
        self._touched.add(group.group_id)
        self._execute(self.deciders.on_sample(group), source="gate")

    def _on_turn(self, msg: TurnDone) -> None:
        """The environment answered a turn: the episode's next turn starts, or the episode ends
        and is decided on as a scored sample (``pipeline.core.episodes``)."""
        request = msg.request
        group = self._groups.get(request.group_id)
        if group is None or group.closed:  # abandoned while the environment answered: counted then
            return
        outcome = self.lifecycle.after_turn(msg, self._out)
        if isinstance(outcome, ScoredSample):
            self.samples.finish(request.request_id)
            truncated = outcome.turns is not None and outcome.turns.truncated
            self.budget.count_episode_end(outcome.result.finish_reason, bool(msg.error), truncated)
            return self._decide_on(outcome)
        following, point = outcome
        self.samples.next_turn(request.request_id, following)
        self._out.append(Start(following))
        self._execute(self.deciders.on_turn(group, request.sample_index, point), source="controller")

    def _execute(self, actions: Sequence[GroupAction], source: str) -> None:
        for action in actions:
            group = self._groups.get(action.group_id)
            if group is None and (source == "controller" or action.origin >= 0):
                # An intervention chosen at a token while the tracker was closing its group.
                self.budget.interventions_dropped += 1
                continue
            group = checked(group, action, source, self.gate if source == "gate" else self.controller)
            if action.kind is ActionKind.LAUNCH:
                self.samples.queue(group, action.n, action.params, action.branch, action.origin)
            elif action.kind is ActionKind.COMMIT:
                if group.seal():
                    self._sealed_open += 1
                self._touched.add(group.group_id)
            elif action.kind is ActionKind.ABANDON:
                self._close(group, committed=False)
        self._pump()

    # --- shipping and closing ------------------------------------------------------------

    def _ship_ready(self) -> None:
        """Close every sealed group with nothing left running: it joins the pending groups."""
        touched, self._touched = self._touched, set()
        for group_id in touched:
            group = self._groups.get(group_id)
            if group is not None and group.sealed and not self.samples.in_flight(group_id):
                self._close(group, committed=True)

    def _close(self, group: GroupRun, committed: bool) -> None:
        closing = self.deciders.snapshot(group)  # as it stood: its samples still counted in flight
        group.close()
        del self._groups[group.group_id]
        self.deciders.forget(group.group_id)
        if group.sealed:
            self._sealed_open -= 1
        for sample in self.samples.started_of(group.group_id):
            request_id = sample.request_id
            self.samples.cancel(request_id)
            self._out.append(Cancel(request_id))
            if self.lifecycle.abandon(request_id, self.samples.streaming(request_id) is not None, self._out):
                self.budget.rollouts_aborted += 1  # closed between two turns: its slot is free now
                self.samples.drop(sample)
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
                self.batches.committed(shipped, group.launched)
                self.controller.on_closed(shipped, closing)
        if not committed:
            self.batches.abandoned(group.launched)
            self.budget.groups_abandoned += 1
            self.controller.on_closed(None, closing)
        self.gate.on_closed(closing, committed)
        for decision_id in group.decision_ids:
            self.trace.log_outcome(decision_id, float(effective), group.tokens)

    # --- learner steps and evaluations ---------------------------------------------------

    def _on_step_done(self, done: StepDone) -> None:
        """Book the step, keep its evaluation, record its metrics; the gate may then act on its
        open groups; a checkpoint when one is due."""
        stale = self.steplog.consumed(done)
        context = {"open_groups": len(self._groups), "engine_time": self.now()}
        metrics = self.steplog.metrics(done, stale, context, {**self.gate.metrics(), **self.controller.metrics()})
        step = done.batch.step + 1
        if done.evaluation is not None:
            metrics.update(done.evaluation)
            self._on_evaluated(step, done.evaluation, done.timing)
        self._out.append(Record(step, metrics))
        self._steps_done = step
        self.batches.trained(done.batch.step)
        self._execute(self.deciders.on_step(done.batch), source="gate")
        if done.learner_state is not None:
            self._out.append(Checkpoint(self.state_dict(), done.learner_state))

    def _on_evaluated(self, step: int, evaluation: Mapping[str, float], timing: Mapping[str, float]) -> None:
        reached = self.steplog.evaluated(step, evaluation, self.gate.metrics(), {"engine_time": self.now()}, timing)
        if reached and not self.stop_reason:
            self.stop_reason = reached

    def _check_progress(self) -> None:
        """Stop (budget spent) or raise ``GateStalled`` instead of waiting forever when nothing
        can produce another message."""
        running = self.samples.started or len(self.samples) or self.batches.batches_sent > self._steps_done
        if running or self.decisions_queued or self.batches.batch_len():  # held groups: the controller's batch
            return
        if self.budget_spent():
            self.stop_reason = f"rollout budget of {self.config.max_rollouts} spent"
            return
        if self.prompts_left is not None and self.prompts_left() == 0:
            self.stop_reason = PROMPTS_EXHAUSTED  # every prompt was handed out and nothing can run
            return
        held = sum(1 for g in self._groups.values() if not self.samples.started_in(g.group_id))
        raise stall_error(self.gate, len(self._groups), held, len(self.pending), self.batches.describe())

    # --- checkpoint: both directions ------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The tracker's part of a checkpoint after the step just finished: the step, the trace's
        watermark (decisions up to it are on disk with the checkpoint), the next group id, the
        budget, the ids of groups still open, the committed groups not yet trained (pending, or
        in batches sent to the learner; kept whole), the gate's and the controller's state, the
        policy version and the evaluations so far.

        >>> from controller.gates.uniform import UniformGate; from controller.noop import NoopController
        >>> from controller.prompts import PromptPool; from pipeline.types import Prompt
        >>> def tracker():
        ...     pool = PromptPool([Prompt(i, "", (1,)) for i in range(8)], seed=0)
        ...     return GroupTracker(UniformGate(pool, 2), NoopController(), OrchestratorConfig(batch_groups=1, group_size=2))
        >>> first = tracker(); first.budget.groups_opened = 3
        >>> second = tracker(); second.load_state_dict(first.state_dict()); second.budget.groups_opened
        3
        """
        self.trace.flush()  # decisions before the checkpoint must be on disk with it
        return {
            "step": self._steps_done,
            "decision_watermark": self.trace.watermark(),
            "next_group_id": self._next_group_id,
            "budget": self.budget.state_dict(),
            "open_group_ids": sorted(self._groups),
            # Their snapshots as they stand: a resumed run closes them, and the gate is handed these.
            "open_groups": [closing_state(self.deciders.snapshot(self._groups[g])) for g in sorted(self._groups)],
            **self.batches.state_dict(),
            "gate": self.gate.state_dict(),
            "controller": self.controller.state_dict(),
            "policy_version": self.policy_version(),
            "evals": list(self.evals),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict``: the gate and controller, the counters, the untrained groups
        first in order; the groups that were open are gone, and the gate is told."""
        self.gate.load_state_dict(state["gate"])
        self.controller.load_state_dict(state["controller"])
        self._steps_done = int(state["step"])
        self._next_group_id = int(state["next_group_id"])
        self.budget.load_state_dict(state["budget"])
        self.batches.load_state_dict(state, self._steps_done)  # untrained groups go first, in order
        self.steplog.evals[:] = list(state.get("evals", []))
        closing = {s["group_id"]: s for s in state.get("open_groups", [])}  # absent from earlier releases
        for group_id in state["open_group_ids"]:
            self.gate.on_closed(closing_from_state(closing.get(group_id, {"group_id": group_id})), False)
