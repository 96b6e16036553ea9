"""Drive a gate through the real ``GroupTracker`` on synthetic rewards, without an engine.

The gate runs under ``pipeline.core.tracker.GroupTracker``, the group lifecycle the orchestrator
runs: its admission limits (step-ahead room included), ``in_flight`` counting queued launches,
``update`` only for unsealed groups, ABANDON closing at once, COMMIT shipping once nothing
runs, committed groups with fewer than two valid rollouts dropped, batches of
``batch_groups`` shipped groups, ``on_step`` after each learner step. The harness plays the
async shell around it (``pipeline.shells.orchestrator``) as a discrete-event simulation, and like the
shell it only sends the tracker messages (``tracker.handle``) and carries out the actions it
returns:

* every launched sample finishes after an exponential duration (so siblings finish out of
  order) with reward 1 with probability ``p[prompt_id]``, or fails with ``fail_prob``;
* each group's first ``target_size`` outcomes are drawn at its first launch, so a test can tell
  what the full group *would* have been (false abandonment);
* a cancelled sample is aborted at once and pays for what it generated until then;
* a learner step takes ``learner_time``; at most one batch waits for the learner;
* a RAIL-like controller may replace a gate's ABANDON by an intervention or extend a COMMIT.

The tracker raises ``GateProtocolError`` on an action on a group that is not open, a gate's
``LAUNCH`` on a sealed group or more plans than slots; the harness adds ``ProtocolViolation``
on ``LAUNCH`` of n < 1, a plan for an unknown prompt, and a group left idle (nothing running,
not sealed, not held) after the gate saw it. ``log`` records every plan and gate action, for
comparing a gate with its restored copy (``clone_with``); ``resumed_with`` resumes from the
tracker's checkpoint as ``train --resume`` does.
"""

from __future__ import annotations

import copy
import heapq
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.config.sections import OrchestratorConfig
from pipeline.core.actions import Cancel, Post, Record, Score, Start, Stop, Train
from pipeline.core.group import GroupRun
from pipeline.core.messages import Started, StepDone, StreamCut, Tick
from pipeline.core.tracker import GroupTracker
from pipeline.protocols import Controller, Gate, GateProtocolError, GateStalled, OpenGroups
from pipeline.shells.handlers import ASKED_BY_SETTINGS, EPISODES, HandlerTable, Refuse, Skip
from pipeline.types import (
    ActionKind,
    FinishReason,
    GroupAction,
    GroupSnapshot,
    SampleFinished,
    StepResult,
    TrainBatch,
)

# A response of n tokens (20 to 79): shared tuples, since allocating them per sample is a
# measurable share of a harness run.
_TOKENS = [(1,) * n for n in range(80)]
_LOGPROBS = [(0.0,) * n for n in range(80)]


class ProtocolViolation(AssertionError):
    """The gate broke the group lifecycle of pipeline/protocols.py."""


@dataclass
class HarnessConfig:
    group_size: int = 8
    batch_groups: int = 4
    steps: int = 6
    max_async_steps: int = 1
    max_open_groups: int = 512
    max_concurrent_samples: int = 1024
    fail_prob: float = 0.0
    learner_time: float = 0.5
    max_groups: int = 0  # stop admitting after this many groups (0 = no limit)
    override_abandon: float = 0.0  # a RAIL-like controller replaces a gate's ABANDON by LAUNCH 2 (<= 2x a group)
    extend_commit: float = 0.0  # ... or adds one intervention sample after a gate's COMMIT
    seed: int = 0

    def orchestrator(self) -> OrchestratorConfig:
        return OrchestratorConfig(
            batch_groups=self.batch_groups,
            group_size=self.group_size,
            steps=self.steps,
            max_async_steps=self.max_async_steps,
            max_open_groups=self.max_open_groups,
            max_concurrent_samples=self.max_concurrent_samples,
        )


class _CheckedGate(Gate):
    """The gate as the tracker sees it: every plan and action logged and checked."""

    def __init__(self, gate: Gate, harness: GateHarness):
        self.gate = gate
        self.harness = harness

    def admit(self, group_ids: range, step: int):
        h = self.harness
        if h.cfg.max_groups:
            group_ids = group_ids[: max(0, h.cfg.max_groups - h.budget.groups_opened)]
        plans = self.gate.admit(group_ids, step) if group_ids else []
        for plan in plans:
            if plan.prompt.prompt_id not in h.p:
                raise ProtocolViolation(f"plan for unknown prompt {plan.prompt.prompt_id}")
            h.log.append(("plan", plan.group_id, plan.prompt.prompt_id, plan.target_size, plan.initial))
        return plans

    def update(self, snapshot: GroupSnapshot, groups: OpenGroups) -> list[GroupAction]:
        return self._checked(self.gate.update(snapshot, groups), "update")

    def on_step(self, step: int, batch: TrainBatch, groups: OpenGroups) -> list[GroupAction]:
        self.harness.log.append(("step", step))
        return self._checked(self.gate.on_step(step, batch, groups), "on_step")

    def _checked(self, actions: list[GroupAction], where: str) -> list[GroupAction]:
        for a in actions:
            self.harness.log.append(("action", where, a.kind.value, a.group_id, a.n, a.reason))
            if a.kind is ActionKind.LAUNCH and a.n < 1:
                raise ProtocolViolation(f"{where}: LAUNCH n={a.n} on group {a.group_id}")
            if a.kind is ActionKind.HOLD:
                self.harness.held.add(a.group_id)
        return actions

    def on_closed(self, closing: GroupSnapshot, committed: bool) -> None:
        self.gate.on_closed(closing, committed)

    def state_dict(self) -> dict[str, Any]:
        return self.gate.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gate.load_state_dict(state)

    def metrics(self) -> dict[str, float]:
        return self.gate.metrics()

    @property
    def uncounted_rollouts(self) -> int:
        return self.gate.uncounted_rollouts

    @property
    def abandons(self) -> bool:
        return self.gate.abandons

    @property
    def reference_strength(self) -> float | None:
        return self.gate.reference_strength


class _Controller(Controller):
    """What ``controller.on_group`` returns: the gate's actions, or, as RAIL may, an
    intervention instead of an ABANDON and extra samples for a committed group. It also
    watches every group close."""

    def __init__(self, harness: GateHarness):
        self.harness = harness
        self.interventions: dict[int, int] = {}  # abandons replaced, per group

    def on_group(self, snapshot: GroupSnapshot, proposed: list[GroupAction]) -> list[GroupAction]:
        h, final = self.harness, []
        if not (h.cfg.override_abandon or h.cfg.extend_commit):
            return proposed
        for a in proposed:
            mine = a.group_id == snapshot.group_id
            if (
                mine
                and a.kind is ActionKind.ABANDON
                and self.interventions.get(a.group_id, 0) < 2
                and h.cfg.override_abandon
                and h.uniform() < h.cfg.override_abandon
            ):
                self.interventions[a.group_id] = self.interventions.get(a.group_id, 0) + 1
                final.append(GroupAction(ActionKind.LAUNCH, a.group_id, n=2, reason="intervene", origin=1))
                continue
            final.append(a)
            if mine and a.kind is ActionKind.COMMIT and h.cfg.extend_commit and h.uniform() < h.cfg.extend_commit:
                final.append(GroupAction(ActionKind.LAUNCH, a.group_id, n=1, reason="extend", origin=2))
        return final

    def on_tokens(self, snapshot, sample_index, delta) -> list[GroupAction]:
        return []

    def on_closed(self, group, snapshot: GroupSnapshot) -> None:
        h = self.harness
        run = h.tracker_run(snapshot.group_id)
        self.interventions.pop(snapshot.group_id, None)
        if run is None:
            return  # closed before it launched anything
        h.closed_groups.append(run)
        if group is None and not run.sealed:  # abandoned, not dropped: would the full group have been mixed?
            first = h.outcomes.get(snapshot.group_id, [])[: run.target_size]
            h.false_abandoned += int(0 < sum(first) < len(first))

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class GateHarness:
    def __init__(self, gate: Gate, probabilities: dict[int, float], config: HarnessConfig | None = None):
        self.gate = gate
        self.p = dict(probabilities)
        self.cfg = config or HarnessConfig()
        self.rng = np.random.default_rng(self.cfg.seed)
        self._uniforms = np.empty(0)
        self._next_uniform = 0
        self.now = 0.0
        self.events: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self.log: list[tuple] = []
        self.held: set[int] = set()  # groups the gate holds (HOLD), until their next launch
        self.outcomes: dict[int, list[float]] = {}  # pre-drawn rewards by group, by sample index
        self.running: dict[str, tuple[GroupRun, Any, float]] = {}  # request id -> (group, request, start)
        self.closed_groups: list[GroupRun] = []
        self._runs: dict[int, GroupRun] = {}  # every group that launched, by id
        self.false_abandoned = self.lost = self.lost_rollouts = 0
        self.learner_busy = False
        self.learner_waiting: list[TrainBatch] = []
        self.batch_log: list[TrainBatch] = []
        self.stop_reason = ""
        self._rewards: dict[str, float] = {}  # drawn at a sample's end, handed over at its Score
        self.tracker = GroupTracker(
            _CheckedGate(gate, self), _Controller(self), self.cfg.orchestrator(), seed=self.cfg.seed, now=self.clock
        )
        self._started = False

    def clock(self) -> float:
        return self.now

    # --- what tests read --------------------------------------------------------------

    @property
    def budget(self):
        return self.tracker.budget

    @property
    def groups(self):
        """The open groups by id."""
        return self.tracker.groups

    @property
    def steps_done(self) -> int:
        return self.tracker.steps_done

    def tracker_run(self, group_id: int) -> GroupRun | None:
        """The tracker's record of a group that launched a sample (None if it never did)."""
        return self._runs.get(group_id)

    @property
    def stats(self) -> dict[str, int]:
        b = self.budget
        return {
            "rollouts": b.rollouts_started,
            "finished": b.rollouts_finished,
            "failed": b.rollouts_failed,
            "aborted": b.rollouts_aborted,
            "opened": b.groups_opened,
            "shipped": b.groups_committed,
            "effective": b.groups_effective,
            "abandoned": b.groups_abandoned - b.groups_dropped_empty,
            "dropped": b.groups_dropped_empty,
            "false_abandoned": self.false_abandoned,
            "tokens": b.tokens_generated,
            "lost": self.lost,
            "lost_rollouts": self.lost_rollouts,  # dropped by a resume (resumed_with)
        }

    # --- driving ----------------------------------------------------------------------

    def run(self, max_events: int | None = None, until_step: int | None = None) -> GateHarness:
        """Run until ``steps`` learner steps are done, the run stalls, ``max_events`` events were
        handled, or (``until_step``) that many learner steps are done: a checkpoint boundary."""
        try:
            return self._run(max_events, until_step)
        except GateProtocolError as exc:
            raise ProtocolViolation(str(exc)) from exc

    def _run(self, max_events: int | None, until_step: int | None) -> GateHarness:
        if not self._started:
            self._started = True
            self._act(self.tracker.handle(Started()))
            self._tick()
        handled = 0
        while self.steps_done < self.cfg.steps and not self.stop_reason:
            if max_events is not None and handled >= max_events:
                return self
            if until_step is not None and self.steps_done >= until_step:
                return self
            if not self.events:
                self._stalled()
                break
            self.now, _, kind, payload = heapq.heappop(self.events)
            handled += 1
            if kind == "sample":
                self._on_sample(payload)
            else:
                self._on_step_done(payload)
            self._tick()
        if not self.stop_reason:
            self.stop_reason = "steps"
        return self

    def _tick(self) -> None:
        """The tracker's turn after each message, as the shell gives it; a stall ends the run
        here as it would raise there."""
        try:
            self._act(self.tracker.handle(Tick()))
        except GateStalled:
            self._stalled()

    def _stalled(self) -> None:
        limited = self.cfg.max_groups and self.budget.groups_opened >= self.cfg.max_groups
        self.stop_reason = "max_groups" if limited else "stalled"

    def clone_with(self, gate: Gate) -> GateHarness:
        """An exact copy of this run whose gate is ``gate`` (restored from a checkpoint)."""
        # Frozen messages are shared, not copied (walking them dominated a clone's cost).
        frozen = [*_TOKENS, *_LOGPROBS, *self.batch_log, *self.learner_waiting, *self.tracker.pending]
        for group in [*self.groups.values(), *self.closed_groups]:
            frozen += [group.prompt, *group.samples]
        frozen += list(self.tracker.samples.requests())
        memo = {id(x): x for x in frozen}
        memo[id(self.gate)] = gate
        return copy.deepcopy(self, memo=memo)

    def resumed_with(self, gate: Gate) -> GateHarness:
        """What ``train --resume`` does, from a checkpoint taken now (``GroupTracker.state_dict``)
        and ``gate`` restored from the same moment: a fresh tracker loads the state, so groups
        that were open are gone and the gate is told so; batches sent but not trained go back in
        front of the pending groups; the learner starts idle; nothing is running."""
        state = self.tracker.state_dict()
        twin = GateHarness(gate, self.p, self.cfg)
        twin.rng, twin._uniforms, twin._next_uniform = copy.deepcopy((self.rng, self._uniforms, self._next_uniform))
        twin.now, twin._seq, twin._started, twin.log = self.now, self._seq, True, list(self.log)
        twin._runs = dict(self._runs)
        twin.outcomes = dict(self.outcomes)
        twin.closed_groups = list(self.closed_groups) + list(self.groups.values())
        twin.false_abandoned = self.false_abandoned
        twin.lost = self.lost + len(self.groups)
        twin.lost_rollouts = self.lost_rollouts + len(self.running)
        twin.batch_log = self.batch_log[: self.steps_done]
        twin.tracker.load_state_dict(state)
        twin._tick()
        return twin

    # --- what the async shell does -----------------------------------------------------

    def _act(self, actions) -> None:
        """Carry out the tracker's actions, in order (``HANDLERS``)."""
        handlers = self.HANDLERS
        for action in actions:
            handlers[type(action)](self, action)

    def _cancel(self, cancel: Cancel) -> None:
        """Aborted at once; it pays for what it generated."""
        group, request, start = self.running.pop(cancel.request_id)
        self._act(self.tracker.handle(StreamCut(request.request_id, int(40 * min(1.0, self.now - start)))))

    def _train(self, train: Train) -> None:
        self.batch_log.append(train.batch)
        self.learner_waiting.append(train.batch)
        self._start_learner()

    def _score(self, score: Score) -> None:
        """The reward drawn when the sample ended."""
        self._act(self.tracker.handle(score.answer(self._rewards.pop(score.request.request_id))))

    def _start(self, start: Start) -> None:
        request = start.request
        group = self.tracker.group(request.group_id)  # open: its sample was just started
        if group.group_id not in self.outcomes:
            p = self.p[group.prompt.prompt_id]
            self.outcomes[group.group_id] = [float(self.uniform() < p) for _ in range(group.target_size)]
            self._runs[group.group_id] = group
        self.held.discard(group.group_id)
        self.running[request.request_id] = (group, request, self.now)
        duration = -math.log(1.0 - self.uniform())  # exponential: siblings finish out of order
        self._push(self.now + duration, "sample", request.request_id)

    def _on_sample(self, request_id: str) -> None:
        entry = self.running.pop(request_id, None)
        if entry is None:
            return  # cancelled with its abandoned group: already counted
        group, request, _ = entry
        length = 20 + int(60 * self.uniform())
        if self.uniform() < self.cfg.fail_prob:
            final = SampleFinished(request_id, (), (), FinishReason.ERROR, 0, error="injected")
            reward = 0.0
        else:
            outcomes = self.outcomes[group.group_id]
            while len(outcomes) <= request.sample_index:
                outcomes.append(float(self.uniform() < self.p[group.prompt.prompt_id]))
            final = SampleFinished(request_id, _TOKENS[length], _LOGPROBS[length], FinishReason.STOP, 0)
            reward = outcomes[request.sample_index]
        self._rewards[request_id] = reward
        self._act(self.tracker.handle(final))
        g = self.tracker.group(group.group_id)
        if (
            g is not None
            and not g.sealed
            and g.group_id not in self.held
            and not self.tracker.samples.in_flight(g.group_id)
        ):
            raise ProtocolViolation(
                f"{type(self.gate).__name__} left group {g.group_id} idle with no verdict "
                f"(rewards={g.rewards}, failed={g.failed})"
            )

    def _start_learner(self) -> None:
        if not self.learner_busy and self.learner_waiting:
            self.learner_busy = True
            self._push(self.now + self.cfg.learner_time, "step", self.learner_waiting.pop(0))

    def _on_step_done(self, batch: TrainBatch) -> None:
        self.learner_busy = False
        self._act(self.tracker.handle(StepDone(batch, StepResult(batch.step + 1, {}), policy_version=batch.step + 1)))
        self._start_learner()

    def uniform(self) -> float:
        """One U(0, 1) draw; drawn in blocks because per-call numpy draws dominate the run time."""
        if self._next_uniform >= len(self._uniforms):
            self._uniforms = self.rng.random(4096)
            self._next_uniform = 0
        self._next_uniform += 1
        return float(self._uniforms[self._next_uniform - 1])

    def _push(self, time: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.events, (time, self._seq, kind, payload))
        self._seq += 1

    _NO_SETTING = "the harness sets no ShellSettings under which the tracker asks for it"
    _SINGLE_TURN = "the harness runs single-turn samples"
    HANDLERS = HandlerTable(
        "the gate harness",
        {
            Start: _start,
            Cancel: _cancel,
            Score: _score,
            Train: _train,
            Record: Skip("metrics lines: the harness counts its own"),
            Stop: Skip("the harness counts steps itself"),
            Post: Refuse("the harness's controllers have no token hook"),
            ASKED_BY_SETTINGS: Refuse(_NO_SETTING),
            EPISODES: Refuse(_SINGLE_TURN),
        },
    )

    # --- checks -----------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Counts add up and every group is accounted for (call after ``run``)."""
        s = self.stats
        if s["rollouts"] != s["finished"] + s["failed"] + s["aborted"] + len(self.running) + s["lost_rollouts"]:
            raise AssertionError(f"rollouts do not add up: {s}, running={len(self.running)}")
        launched = sum(g.launched for g in self.groups.values()) + sum(g.launched for g in self.closed_groups)
        if launched != s["rollouts"]:
            raise AssertionError(f"per-group launches {launched} != rollouts {s['rollouts']}")
        if s["opened"] != len(self.groups) + s["shipped"] + s["abandoned"] + s["dropped"] + s["lost"]:
            raise AssertionError(f"groups do not add up: {s}, open={len(self.groups)}")
        for batch in self.batch_log:
            if len(batch.groups) != self.cfg.batch_groups:
                raise AssertionError(f"batch {batch.step} has {len(batch.groups)} groups")
            if any(len(g.rollouts) < 2 for g in batch.groups):
                raise AssertionError(f"batch {batch.step} holds a group with fewer than 2 rollouts")
        for g in self.groups.values():
            if not (g.sealed or g.group_id in self.held or self.tracker.samples.in_flight(g.group_id)):
                raise AssertionError(f"group {g.group_id} is open with no verdict and nothing running")
        if self.cfg.fail_prob == 0 and s["dropped"]:
            raise AssertionError(f"{s['dropped']} committed groups had fewer than 2 rollouts without any failure")
