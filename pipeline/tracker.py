"""The group tracker: every group's state, and what the gate and the controller make of it.

``GroupTracker`` is synchronous and knows no event loop, engine or learner. It is the single
writer of group state: it opens groups through ``gate.admit``, queues their launches under the
concurrency limit, asks ``gate.update`` and ``controller.on_group`` about every finished
sample, executes the actions they return (launch, commit, abandon), ships committed groups
into batches, keeps the rollout budget, and checkpoints all of it. Each call returns a
``TrackerOutput``: the samples to start and the ones to cancel. The caller does them at once,
in order -- the orchestrator's async shell (``pipeline.orchestrator``) starts an engine stream
per launch; the gate conformance harness (``tests/gate_harness.py``) schedules a simulated
finish -- so the same lifecycle runs under both.

>>> from controller.gates.uniform import UniformGate; from controller.noop import NoopController
>>> from controller.prompts import PromptPool; from pipeline.config.sections import OrchestratorConfig
>>> from pipeline.types import FinishReason, Prompt, SampleFinished, ScoredSample
>>> pool = PromptPool([Prompt(i, "", (1,)) for i in range(8)], seed=0)
>>> cfg = OrchestratorConfig(batch_groups=1, group_size=2, steps=1, max_concurrent_samples=4, max_open_groups=2)
>>> tracker = GroupTracker(UniformGate(pool, 2), NoopController(), cfg)
>>> out = tracker.admit()
>>> [launch.request.request_id for launch in out.launches]       # two groups of two
['g0-s0', 'g0-s1', 'g1-s0', 'g1-s1']
>>> for launch in out.launches[:2]:                               # group 0's samples end
...     done = SampleFinished(launch.request.request_id, (7,), (0.0,), FinishReason.STOP, 0)
...     _ = tracker.on_sample(ScoredSample(launch.request, done, reward=1.0))
>>> _ = tracker.ship_ready(); batch = tracker.next_batch()
>>> batch.step, [g.group_id for g in batch.groups]
(0, [0])
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from pipeline.batches import StepCutter
from pipeline.config.sections import OrchestratorConfig
from pipeline.decisions import NullSink, gate_decision
from pipeline.group import GroupRun
from pipeline.hooktimer import HookTimer
from pipeline.metrics import Budget
from pipeline.protocols import Controller, DecisionSink, Gate
from pipeline.seeding import sample_seed
from pipeline.types import (ActionKind, BranchSpec, CommittedGroup, FinishReason, GroupAction, SampleFinished,
                            SampleRequest, SamplingParams, ScoredSample, TokenDelta, TrainBatch)


DECIDE_WITHIN_EVENTS = 64
"""Queued decision points wait at most this many tracking-loop events for their batch."""


class GateStalled(RuntimeError):
    """Nothing is running and the gate opens no group: the run cannot make progress."""


class GateProtocolError(RuntimeError):
    """A gate or controller broke the group lifecycle of ``pipeline/protocols.py``."""


@dataclass(frozen=True)
class Launch:
    """Start this sample now: ``request`` belongs to ``group``."""

    group: GroupRun
    request: SampleRequest


@dataclass
class TrackerOutput:
    """What the caller must do after a tracker call: start ``launches``, cancel ``cancels``
    (request ids of running samples whose group was abandoned)."""

    launches: list[Launch] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)


_NOTHING = TrackerOutput(launches=(), cancels=())  # type: ignore[arg-type]  # a call that does nothing; shared, read-only


class GroupTracker:
    """Group state, admission, actions, batches and budget of one run; see the module docstring.

    ``now`` and ``policy_version`` read the engine's clock and weights version (for request
    launch times, snapshots and trace records); both default to constants for engine-free use.
    """

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
    ):
        self.gate = gate
        self.controller = controller
        self.config = config
        self.seed = seed
        self.run_id = run_id
        self.trace = trace if trace is not None else NullSink()
        self._records = not isinstance(self.trace, NullSink)
        self.hook_timer = hook_timer
        self.now = now
        self.policy_version = policy_version
        self.budget = Budget()
        self.stop_reason = ""
        self.batches = StepCutter(config.batch_groups, config.batch_rollouts)  # committed groups -> batches
        self._default_params = SamplingParams(temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_tokens)
        self._groups: dict[int, GroupRun] = {}
        self._next_group_id = 0
        self._launch_queue: deque[tuple[GroupRun, SamplingParams | None, BranchSpec | None, int]] = deque()
        self._in_flight = 0  # samples launched and not yet seen finished or cancelled
        self._sealed_open = 0  # open groups that are sealed (committed, still finishing)
        self._touched: set[int] = set()  # groups that may have become ready to ship
        self._steps_done = 0
        self._out = TrackerOutput()
        self._token_hooks = controller.wants_tokens
        self._flush_sent = False
        self._held: dict[int, list[GroupAction]] = {}  # gate proposals the controller holds until its batch is decided
        self._events_since_flush = 0

    # --- what the caller reads -----------------------------------------------------------

    @property
    def pending(self) -> list[CommittedGroup]:
        """Committed groups waiting to fill a batch, in order."""
        return self.batches.pending

    @property
    def steps_done(self) -> int:
        return self._steps_done

    @property
    def next_group_id(self) -> int:
        return self._next_group_id

    @property
    def groups(self) -> Mapping[int, GroupRun]:
        """The open groups by id (read-only)."""
        return MappingProxyType(self._groups)

    def group(self, group_id: int) -> GroupRun | None:
        """The open group ``group_id`` (None once it closed)."""
        return self._groups.get(group_id)

    def _output(self) -> TrackerOutput:
        out = self._out
        if not out.launches and not out.cancels:
            return _NOTHING  # most calls start and cancel nothing: no allocation
        self._out = TrackerOutput()
        return out

    # --- admission and launches ----------------------------------------------------------

    def admit(self) -> TrackerOutput:
        """Open the groups the gate wants while the step-ahead, open-group and concurrency
        limits leave room; launch what can start."""
        cfg = self.config
        b = cfg.step_groups
        # Every open group may still commit, so open groups count against the step-ahead limit.
        committed_ahead = (self.batches.batches_sent - self._steps_done) * b + len(self.pending) + len(self._groups)
        still_needed = cfg.steps * b - (self.batches.batches_sent * b + len(self.pending) + self._sealed_open)
        if committed_ahead >= (cfg.max_async_steps + 1) * b or still_needed <= 0 or self.stop_reason or self.budget_spent():
            return self._output()
        free = cfg.max_concurrent_samples - self._in_flight - len(self._launch_queue)
        room = (cfg.max_async_steps + 1) * b - committed_ahead
        slots = min(cfg.max_open_groups - len(self._groups), free // cfg.group_size, room)
        if slots <= 0:
            return self._output()
        offered = range(self._next_group_id, self._next_group_id + slots)
        plans = self.gate.admit(offered, self.batches.batches_sent)
        if [plan.group_id for plan in plans] != list(offered[: len(plans)]):
            raise GateProtocolError(
                f"{type(self.gate).__name__}.admit({offered}) returned plans for groups {[p.group_id for p in plans]}; "
                "the i-th plan must take the i-th offered id"
            )
        for plan in plans:
            group = GroupRun(plan.group_id, plan.prompt, plan.target_size, self.batches.batches_sent)
            self._next_group_id += 1
            self._groups[group.group_id] = group
            self.budget.groups_opened += 1
            self._enqueue(group, plan.initial, plan.params, None)
        self._pump()
        return self._output()

    def budget_spent(self) -> bool:
        limit = self.config.max_rollouts
        # A benchmark-only gate (the oracle) may book some of its cost as uncounted.
        return bool(limit) and self.budget.rollouts_started - self.gate.uncounted_rollouts >= limit

    def pump(self) -> TrackerOutput:
        """Launch queued samples while the concurrency limit allows."""
        self._pump()
        return self._output()

    def _pump(self) -> None:
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

    def _launch(self, group: GroupRun, params: SamplingParams | None, branch: BranchSpec | None, origin: int) -> None:
        index = group.launched
        base = params or self._default_params
        params = SamplingParams(base.temperature, base.top_p, base.max_tokens, sample_seed(self.seed, group.group_id, index))
        request = SampleRequest(
            request_id=f"g{group.group_id}-s{index}", group_id=group.group_id, sample_index=index,
            prompt=group.prompt, params=params, branch=branch, launch_time=self.now(), origin=origin,
        )
        group.in_flight[request.request_id] = request
        group.launched += 1
        self._in_flight += 1
        self.budget.rollouts_started += 1
        if origin >= 0:
            self.budget.rollouts_intervention += 1
        self._out.launches.append(Launch(group, request))

    # --- a running sample (called from its task) -----------------------------------------

    def on_tokens(self, group: GroupRun, sample_index: int, delta: TokenDelta) -> list[GroupAction]:
        """A streamed delta: count its tokens; the controller's token hook, if it wants them."""
        n = len(delta.token_ids)
        group.tokens += n
        self.budget.tokens_generated += n
        if self._token_hooks and not group.closed:
            return self.controller.on_tokens(group.snapshot(self.policy_version()), sample_index, delta)
        return []

    def sample_ended(self, group: GroupRun, request: SampleRequest, finished: SampleFinished, streamed: int) -> None:
        """The engine's final event: count it and the tokens it adds beyond the deltas."""
        reason = finished.finish_reason
        if reason is FinishReason.ABORTED:
            self.budget.rollouts_aborted += 1
        elif reason is FinishReason.ERROR:
            self.budget.rollouts_failed += 1
        else:
            self.budget.rollouts_finished += 1
        extra = max(0, finished.num_tokens - (request.branch.prefix_len if request.branch else 0) - streamed)
        self.budget.tokens_generated += extra
        group.tokens += extra

    def abort_tokens(self, request: SampleRequest, n: int = 0, final: SampleFinished | None = None, streamed: int = 0) -> None:
        """Tokens a cancelled sample produced while it was being aborted (not its group's)."""
        if final is not None:
            n = max(0, final.num_tokens - (request.branch.prefix_len if request.branch else 0) - streamed)
        self.budget.tokens_generated += n

    def sample_cancelled(self, group: GroupRun) -> None:
        """A sample of an abandoned group was aborted."""
        self.budget.rollouts_aborted += 1
        group.aborted += 1

    def sample_gone(self) -> None:
        """A cancelled sample's task ended: its engine slot is free."""
        self._in_flight -= 1

    # --- decisions -----------------------------------------------------------------------

    def on_sample(self, scored: ScoredSample) -> TrackerOutput:
        """A sample ended and was scored: the gate and the controller decide; their actions run."""
        self._in_flight -= 1  # counted until the tracker has seen it, so a stall check cannot race it
        group = self._groups.get(scored.request.group_id)
        reason = scored.result.finish_reason
        if group is None or group.closed:
            return self._output()  # a straggler of an abandoned group: counted by its task
        group.in_flight.pop(scored.request.request_id, None)
        if reason is FinishReason.ERROR:
            group.failed += 1
        elif reason is FinishReason.ABORTED:
            group.aborted += 1
        group.add(scored)
        self._touched.add(group.group_id)
        started = time.perf_counter_ns() if self.hook_timer is not None else 0
        snapshot = group.snapshot(self.policy_version())
        proposed = [] if group.sealed else self.gate.update(snapshot)
        final = self.controller.on_group(snapshot, proposed)
        if self.hook_timer is not None:
            self.hook_timer.record(time.perf_counter_ns() - started)
        # A HOLD the gate did not propose: the controller queued a decision on this group and
        # holds the gate's proposal until its batch is decided (``on_decide_queued``).
        deferred = () if final is proposed else {a.group_id for a in final if a.kind is ActionKind.HOLD and a not in proposed}
        for action in proposed:
            if action.group_id in deferred and action not in final:
                self._held.setdefault(action.group_id, []).append(action)
            else:
                # The trace says what the gate proposed and whether it ran (the controller may
                # replace an abandon by an intervention).
                self._log_gate_decision(action, executed=action in final)
        self._execute(final, source="gate")
        return self._output()

    def on_controller_actions(self, actions: Sequence[GroupAction]) -> TrackerOutput:
        """Actions the controller chose at a token-level decision point."""
        self._execute(actions, source="controller")
        return self._output()

    def on_decide_queued(self) -> TrackerOutput:
        """The decision points the controller queued, decided now in one batch. A held gate
        proposal is logged now, as executed when the controller's actions include it."""
        self._flush_sent = False
        self._events_since_flush = 0
        actions = self.controller.flush_decisions()
        held, self._held = self._held, {}
        for proposals in held.values():
            for action in proposals:
                self._log_gate_decision(action, executed=action in actions)
        return self.on_controller_actions(actions)

    def flush_wanted(self) -> bool:
        """True once per batch of token-level decision points queued by a sample task (then a
        ``DecideQueued`` wakes the tracking loop, which decides them once ``decide_due``)."""
        if self._flush_sent or not self._token_hooks or not self.decisions_queued:
            return False
        self._flush_sent = True
        return True

    @property
    def decisions_queued(self) -> int:
        """Decision points the controller queued and has not decided yet."""
        return getattr(self.controller, "queued_decisions", 0)

    def decide_due(self, waiting_events: int) -> bool:
        """Whether the controller's queued decision points are to be decided now: when no event
        is waiting for the tracking loop (the points of this tick are in), or after
        ``DECIDE_WITHIN_EVENTS`` events, so that a loop that never drains still decides them."""
        if not self.decisions_queued:
            self._events_since_flush = 0
            return False
        self._events_since_flush += 1
        return waiting_events == 0 or self._events_since_flush >= DECIDE_WITHIN_EVENTS

    def _execute(self, actions: Sequence[GroupAction], source: str) -> None:
        for action in actions:
            group = self._groups.get(action.group_id)
            if group is None and (source == "controller" or action.origin >= 0):
                # An intervention chosen at a token while the tracker was closing its group.
                self.budget.interventions_dropped += 1
                continue
            if group is None:
                raise GateProtocolError(
                    f"{source} ({type(self.gate if source == 'gate' else self.controller).__name__}) "
                    f"acted on group {action.group_id}, which is not open; a gate may only act on groups it opened "
                    "and has not committed or abandoned"
                )
            if action.kind is ActionKind.LAUNCH:
                if group.sealed and action.origin < 0:
                    raise GateProtocolError(
                        f"{source} launched {action.n} samples on sealed group {group.group_id}; emit LAUNCH before COMMIT"
                    )
                self._enqueue(group, action.n, action.params, action.branch, action.origin)
            elif action.kind is ActionKind.COMMIT:
                if not group.sealed:
                    group.sealed = True
                    self._sealed_open += 1
                self._touched.add(group.group_id)
            elif action.kind is ActionKind.ABANDON:
                self._close(group, committed=False)
        self._pump()

    def _log_gate_decision(self, action: GroupAction, executed: bool = True) -> None:
        group = self._groups.get(action.group_id)
        if group is None:
            return
        decision_id = self.trace.next_decision_id()
        group.decision_ids.append(decision_id)
        if self._records:  # a NullSink keeps none: do not build them
            self.trace.log_decision(gate_decision(
                decision_id, action, prompt=group.prompt, rewards=group.rewards, in_flight=len(group.in_flight),
                launched=group.launched, target_size=group.target_size, executed=executed, time=self.now(),
                run_id=self.run_id, policy_version=self.policy_version(),
            ))

    # --- shipping and closing ------------------------------------------------------------

    def ship_ready(self) -> TrackerOutput:
        """Close every sealed group with nothing left running: it joins the pending groups."""
        touched, self._touched = self._touched, set()
        for group_id in touched:
            group = self._groups.get(group_id)
            if group is not None and group.sealed and not group.in_flight and not group.queued:
                self._close(group, committed=True)
        return self._output()

    def _close(self, group: GroupRun, committed: bool) -> None:
        group.closed = True
        del self._groups[group.group_id]
        self._held.pop(group.group_id, None)
        if group.sealed:
            self._sealed_open -= 1
        self._out.cancels.extend(group.in_flight)
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
                self.controller.on_closed(shipped, group.snapshot(self.policy_version()))
        if not committed:
            self.batches.abandoned(group.launched)
            self.budget.groups_abandoned += 1
            self.controller.on_closed(None, group.snapshot(self.policy_version()))
        self.gate.on_closed(group.group_id, committed)
        for decision_id in group.decision_ids:
            self.trace.log_outcome(decision_id, float(effective), group.tokens)

    # --- batches and learner steps -------------------------------------------------------

    def next_batch(self) -> TrainBatch | None:
        """The next batch, when the pending groups fill one and the run needs one (a step is
        ``batch_groups`` groups, or ``batch_rollouts`` rollouts spent: ``pipeline.batches``); it
        leaves the tracker only at ``batch_sent``."""
        return self.batches.next_batch(self.config.steps)

    def batch_sent(self, batch: TrainBatch) -> None:
        """``batch`` (from ``next_batch``) is on its way to the learner."""
        self.batches.sent(batch)

    def on_step_done(self, batch: TrainBatch) -> TrackerOutput:
        """The learner trained on ``batch``: the gate may act on its open groups."""
        self._steps_done = batch.step + 1
        self.batches.trained(batch.step)
        step_actions = self.gate.on_step(batch.step, batch)
        for action in step_actions:
            self._log_gate_decision(action)
        self._execute(step_actions, source="gate")
        return self._output()

    def check_progress(self) -> None:
        """Stop (budget spent) or raise ``GateStalled`` instead of waiting forever when nothing
        can produce another event."""
        if self._in_flight or self._launch_queue or self.batches.batches_sent > self._steps_done:
            return
        if self.decisions_queued:
            return  # held groups wait for the controller's batch
        if self.batches.batch_len():
            return
        if self.budget_spent():
            self.stop_reason = f"rollout budget of {self.config.max_rollouts} spent"
            return
        held = sum(1 for g in self._groups.values() if not g.in_flight)
        raise GateStalled(
            f"the gate ({type(self.gate).__name__}) opened no group while nothing is running "
            f"({len(self._groups)} open groups, {held} of them held with nothing in flight, "
            f"{len(self.pending)} committed groups waiting for a batch of {self.batches.describe()}); "
            "the prompt pool may be exhausted or emptied by eviction -- add prompts, relax eviction, "
            "or lower orchestrator.batch_groups"
        )

    # --- checkpoint ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The tracker's part of a checkpoint after the step just finished. Groups still open
        are listed so that a resumed run can tell the gate they are gone; committed groups not
        yet trained (pending, or in batches sent to the learner) are kept whole."""
        self.trace.flush()  # decisions before the checkpoint must be on disk with it
        return {
            "step": self._steps_done,
            "decision_watermark": self.trace.watermark(),
            "next_group_id": self._next_group_id,
            "budget": self.budget.state_dict(),
            "open_group_ids": sorted(self._groups),
            **self.batches.state_dict(),
            "gate": self.gate.state_dict(),
            "controller": self.controller.state_dict(),
            "policy_version": self.policy_version(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict``: the groups that were open are gone (the gate is told)."""
        self._steps_done = int(state["step"])
        self._next_group_id = int(state["next_group_id"])
        self.budget.load_state_dict(state["budget"])
        self.batches.load_state_dict(state, self._steps_done)  # untrained groups go first, in order
        for group_id in state["open_group_ids"]:
            self.gate.on_closed(group_id, False)
