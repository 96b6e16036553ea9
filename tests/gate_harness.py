"""A fake, engine-free orchestrator that drives a gate on synthetic rewards.

It plays the part of ``pipeline/orchestrator.py`` with the same rules (admission limits,
``update`` only for unsealed groups, ABANDON closes at once, COMMIT ships once nothing runs,
committed groups with fewer than two valid rollouts are dropped, batches of ``batch_groups``
shipped groups, ``on_step`` after each learner step) in a discrete-event simulation:

* every launched sample finishes after an exponential duration (so siblings finish out of
  order) with reward 1 with probability ``p[prompt_id]``, or fails with ``fail_prob``;
* each group's first ``group_size`` outcomes are drawn when it opens, so a test can tell what
  the full group *would* have been (false abandonment);
* a learner step takes ``learner_time``; at most one batch waits for the learner.

It checks the gate protocol as it goes and raises ``ProtocolViolation`` on: an action on a group
that is not open, ``LAUNCH`` of n < 1 or on a sealed group, and a group left idle (nothing
running, not sealed, not held) after the gate saw it. ``log`` records every plan and action,
for comparing a gate with its restored copy (``clone_with``); ``resumed_with`` replays what
``train --resume`` does at a step boundary. Like the orchestrator, a snapshot's ``in_flight``
does not count launches still queued for engine capacity.
"""

from __future__ import annotations

import copy
import heapq
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from pipeline.protocols import Gate
from pipeline.types import (
    ActionKind,
    CommittedGroup,
    FinishReason,
    GroupAction,
    GroupSnapshot,
    Prompt,
    Rollout,
    TrainBatch,
)


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
    cap_slots: bool = False  # also cap slots by the step-ahead room (the orchestrator does not)
    override_abandon: float = 0.0  # a RAIL-like controller replaces a gate's ABANDON by LAUNCH 2 (<= 2x a group)
    extend_commit: float = 0.0  # ... or adds one intervention sample after a gate's COMMIT
    seed: int = 0


@dataclass
class FakeGroup:
    group_id: int
    prompt: Prompt
    target_size: int
    outcomes: list[float]  # pre-drawn rewards by sample index (more drawn on demand)
    launched: int = 0
    queued: int = 0
    failed: int = 0
    aborted: int = 0
    tokens: int = 0
    sealed: bool = False
    held: bool = False
    rewards: list[float] = field(default_factory=list)
    running: dict[int, float] = field(default_factory=dict)  # sample index -> start time
    interventions: int = 0  # abandons the fake controller replaced
    status: str = "open"  # open | shipped | abandoned | dropped

    def snapshot(self) -> GroupSnapshot:
        return GroupSnapshot(
            self.group_id, self.prompt, self.target_size, tuple(self.rewards), len(self.running),
            self.launched, self.failed, self.tokens, 0,
        )

    @property
    def would_be_mixed(self) -> bool:
        first = self.outcomes[: self.target_size]
        return 0 < sum(first) < len(first)


class GateHarness:
    def __init__(self, gate: Gate, probabilities: dict[int, float], config: HarnessConfig | None = None):
        self.gate = gate
        self.p = dict(probabilities)
        self.prompts = {i: Prompt(i, f"p{i}", (i,)) for i in self.p}
        self.cfg = config or HarnessConfig()
        self.rng = np.random.default_rng(self.cfg.seed)
        self._uniforms = np.empty(0)
        self._next_uniform = 0
        self.now = 0.0
        self.events: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self.groups: dict[int, FakeGroup] = {}
        self.next_group_id = 0
        self.launch_queue: list[int] = []
        self.in_flight = 0
        self.pending: list[CommittedGroup] = []
        self.batches_sent = 0
        self.steps_done = 0
        self.learner_busy = False
        self.learner_waiting: list[TrainBatch] = []
        self.log: list[tuple] = []
        self.stats: dict[str, int] = {
            "rollouts": 0, "finished": 0, "failed": 0, "aborted": 0, "opened": 0, "shipped": 0,
            "effective": 0, "abandoned": 0, "dropped": 0, "false_abandoned": 0, "tokens": 0,
            "lost": 0, "lost_rollouts": 0,  # dropped by a resume (resumed_with)
        }
        self.stop_reason = ""
        self.batch_log: list[TrainBatch] = []
        self.closed_groups: list[FakeGroup] = []
        self.sealed_open = 0

    # --- driving ----------------------------------------------------------------------

    def run(self, max_events: int | None = None, until_step: int | None = None) -> "GateHarness":
        """Run until ``steps`` learner steps are done, the run stalls, ``max_events`` events were
        handled, or (``until_step``) that many learner steps are done: a checkpoint boundary."""
        if not self.events and self.stats["opened"] == 0:
            self._admit()
        handled = 0
        while self.steps_done < self.cfg.steps and not self.stop_reason:
            if max_events is not None and handled >= max_events:
                return self
            if until_step is not None and self.steps_done >= until_step:
                return self
            if not self.events:
                if self.cfg.max_groups and self.stats["opened"] >= self.cfg.max_groups:
                    self.stop_reason = "max_groups"
                else:
                    self.stop_reason = "stalled"
                break
            self.now, _, kind, payload = heapq.heappop(self.events)
            handled += 1
            if kind == "sample":
                self._on_sample(*payload)
            else:
                self._on_step_done(payload)
            self._send_batches()
            self._pump()
            self._admit()
        if not self.stop_reason:
            self.stop_reason = "steps"
        return self

    def clone_with(self, gate: Gate) -> "GateHarness":
        """An exact copy of this run whose gate is ``gate`` (restored from a checkpoint)."""
        return copy.deepcopy(self, memo={id(self.gate): gate})

    def resumed_with(self, gate: Gate) -> "GateHarness":
        """What ``train --resume`` does after a step boundary (pipeline/orchestrator.py
        ``_restore``): groups that were open are gone and the gate is told so
        (``on_closed(gid, False)``, ascending ids); batches sent but not trained go back in
        front of the pending groups; the learner starts idle."""
        twin = self.clone_with(gate)
        dropped = sorted(twin.groups)
        for gid in dropped:
            g = twin.groups.pop(gid)
            twin.in_flight -= len(g.running)
            twin.stats["lost_rollouts"] += len(g.running)
            twin.stats["lost"] += 1
            twin.sealed_open -= int(g.sealed)
            g.running.clear()
            g.status = "lost"
            twin.closed_groups.append(g)
        twin.launch_queue = []
        twin.events = [e for e in twin.events if e[2] == "sample"]  # stragglers of dropped groups: ignored
        heapq.heapify(twin.events)
        untrained = [g for b in twin.batch_log[twin.steps_done:] for g in b.groups]
        twin.pending = untrained + twin.pending
        twin.batch_log = twin.batch_log[: twin.steps_done]
        twin.batches_sent = twin.steps_done
        twin.learner_busy, twin.learner_waiting = False, []
        for gid in dropped:
            twin.gate.on_closed(gid, False)
        twin._send_batches()
        twin._admit()
        return twin

    # --- admission and launches -------------------------------------------------------

    def _admit(self) -> None:
        cfg, b = self.cfg, self.cfg.batch_groups
        sealed_open = self.sealed_open
        ahead = (self.batches_sent - self.steps_done) * b + len(self.pending) + len(self.groups)
        still = cfg.steps * b - (self.batches_sent * b + len(self.pending) + sealed_open)
        if ahead >= (cfg.max_async_steps + 1) * b or still <= 0:
            return
        if cfg.max_groups and self.stats["opened"] >= cfg.max_groups:
            return
        free = cfg.max_concurrent_samples - self.in_flight - len(self.launch_queue)
        slots = min(cfg.max_open_groups - len(self.groups), free // cfg.group_size)
        if cfg.max_groups:
            slots = min(slots, cfg.max_groups - self.stats["opened"])
        if cfg.cap_slots:
            slots = min(slots, (cfg.max_async_steps + 1) * b - ahead)
        if slots <= 0:
            return
        plans = self.gate.admit(slots, self.batches_sent)
        if len(plans) > slots:
            raise ProtocolViolation(f"admit({slots}) returned {len(plans)} plans")
        for plan in plans:
            if plan.prompt.prompt_id not in self.p:
                raise ProtocolViolation(f"plan for unknown prompt {plan.prompt.prompt_id}")
            if plan.initial < 1:
                raise ProtocolViolation(f"plan with initial={plan.initial}: the gate could never learn its group id")
            p = self.p[plan.prompt.prompt_id]
            outcomes = [float(self._uniform() < p) for _ in range(plan.target_size)]
            group = FakeGroup(self.next_group_id, plan.prompt, plan.target_size, outcomes)
            self.next_group_id += 1
            self.groups[group.group_id] = group
            self.stats["opened"] += 1
            self.log.append(("plan", group.group_id, plan.prompt.prompt_id, plan.target_size, plan.initial))
            self._enqueue(group, plan.initial)
        self._pump()

    def _enqueue(self, group: FakeGroup, n: int) -> None:
        self.launch_queue.extend([group.group_id] * n)
        group.queued += n

    def _pump(self) -> None:
        while self.launch_queue and self.in_flight < self.cfg.max_concurrent_samples:
            group = self.groups.get(self.launch_queue.pop(0))
            if group is None:
                continue  # closed while queued
            group.queued -= 1
            index = group.launched
            group.launched += 1
            group.held = False
            group.running[index] = self.now
            self.in_flight += 1
            self.stats["rollouts"] += 1
            duration = -math.log(1.0 - self._uniform())  # exponential: siblings finish out of order
            self._push(self.now + duration, "sample", (group.group_id, index))

    def _uniform(self) -> float:
        """One U(0, 1) draw; drawn in blocks because per-call numpy draws dominate the run time."""
        if self._next_uniform >= len(self._uniforms):
            self._uniforms = self.rng.random(4096)
            self._next_uniform = 0
        self._next_uniform += 1
        return float(self._uniforms[self._next_uniform - 1])

    def _push(self, time: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.events, (time, self._seq, kind, payload))
        self._seq += 1

    # --- samples and actions ----------------------------------------------------------

    def _on_sample(self, group_id: int, index: int) -> None:
        group = self.groups.get(group_id)
        if group is None or index not in group.running:
            return  # aborted with its abandoned group: already counted
        del group.running[index]
        self.in_flight -= 1
        length = 20 + int(60 * self._uniform())
        group.tokens += length
        self.stats["tokens"] += length
        if self._uniform() < self.cfg.fail_prob:
            group.failed += 1
            self.stats["failed"] += 1
        else:
            while len(group.outcomes) <= index:
                group.outcomes.append(float(self._uniform() < self.p[group.prompt.prompt_id]))
            group.rewards.append(group.outcomes[index])
            self.stats["finished"] += 1
        if group.sealed:
            self._ship_ready([group_id])
            return
        actions = self._controller(group, self.gate.update(group.snapshot()))
        self._execute(actions, "update")
        self._check_not_idle(group_id)

    def _controller(self, group: FakeGroup, proposed: list[GroupAction]) -> list[GroupAction]:
        """What ``controller.on_group(snapshot, proposed)`` returns: the gate's actions, or, as
        RAIL may, an intervention instead of an ABANDON and extra samples for a committed group."""
        final = []
        for a in proposed:
            mine = a.group_id == group.group_id
            if (mine and a.kind is ActionKind.ABANDON and group.interventions < 2
                    and self._uniform() < self.cfg.override_abandon):
                group.interventions += 1
                final.append(GroupAction(ActionKind.LAUNCH, a.group_id, n=2, reason="intervene", origin=1))
                continue
            final.append(a)
            if mine and a.kind is ActionKind.COMMIT and self._uniform() < self.cfg.extend_commit:
                final.append(GroupAction(ActionKind.LAUNCH, a.group_id, n=1, reason="extend", origin=2))
        return final

    def _check_not_idle(self, group_id: int) -> None:
        g = self.groups.get(group_id)
        if g is not None and not g.sealed and not g.held and not g.running and not g.queued:
            raise ProtocolViolation(
                f"{type(self.gate).__name__} left group {group_id} idle with no verdict "
                f"(rewards={g.rewards}, failed={g.failed})"
            )

    def _execute(self, actions: list[GroupAction], where: str) -> None:
        touched = []
        for a in actions:
            self.log.append(("action", where, a.kind.value, a.group_id, a.n, a.reason))
            group = self.groups.get(a.group_id)
            if group is None:
                raise ProtocolViolation(f"{where}: {a.kind.value} on group {a.group_id}, which is not open")
            if a.kind is ActionKind.LAUNCH:
                if group.sealed and a.origin < 0:
                    raise ProtocolViolation(f"{where}: LAUNCH on sealed group {a.group_id}")
                if a.n < 1:
                    raise ProtocolViolation(f"{where}: LAUNCH n={a.n} on group {a.group_id}")
                self._enqueue(group, a.n)
            elif a.kind is ActionKind.COMMIT:
                self.sealed_open += int(not group.sealed)
                group.sealed = True
                touched.append(a.group_id)
            elif a.kind is ActionKind.ABANDON:
                self._close(group, committed=False)
            elif a.kind is ActionKind.HOLD:
                group.held = True
        self._pump()
        self._ship_ready(touched)

    def _ship_ready(self, group_ids: list[int]) -> None:
        for gid in group_ids:
            g = self.groups.get(gid)
            if g is not None and g.sealed and not g.running and not g.queued:
                self._close(g, committed=True)

    def _close(self, group: FakeGroup, committed: bool) -> None:
        del self.groups[group.group_id]
        self.sealed_open -= int(group.sealed)
        for index, start in group.running.items():  # aborted siblings pay for what they generated
            self.in_flight -= 1
            self.stats["aborted"] += 1
            partial = int(40 * min(1.0, self.now - start))
            group.tokens += partial
            self.stats["tokens"] += partial
        group.running.clear()
        if committed:
            if len(group.rewards) < 2:
                group.status, committed = "dropped", False
                self.stats["dropped"] += 1
            else:
                group.status = "shipped"
                shipped = self._committed(group)
                self.stats["shipped"] += 1
                self.stats["effective"] += int(shipped.is_effective)
                self.pending.append(shipped)
        else:
            group.status = "abandoned"
            self.stats["abandoned"] += 1
            self.stats["false_abandoned"] += int(group.would_be_mixed)
        self.closed_groups.append(group)
        self.gate.on_closed(group.group_id, committed)

    def _committed(self, g: FakeGroup) -> CommittedGroup:
        rollouts = tuple(
            Rollout(f"g{g.group_id}-s{i}", i, g.prompt.token_ids, (1,), (0.0,), r, FinishReason.STOP, 0)
            for i, r in enumerate(g.rewards)
        )
        return CommittedGroup(g.group_id, g.prompt.prompt_id, rollouts, g.launched, g.tokens)

    # --- batches and the learner ------------------------------------------------------

    def _send_batches(self) -> None:
        b = self.cfg.batch_groups
        while len(self.pending) >= b and self.batches_sent < self.cfg.steps and len(self.learner_waiting) < 1:
            batch = TrainBatch(self.batches_sent, tuple(self.pending[:b]))
            del self.pending[:b]
            self.batches_sent += 1
            self.batch_log.append(batch)
            self.learner_waiting.append(batch)
            self._start_learner()

    def _start_learner(self) -> None:
        if not self.learner_busy and self.learner_waiting:
            self.learner_busy = True
            self._push(self.now + self.cfg.learner_time, "step", self.learner_waiting.pop(0))

    def _on_step_done(self, batch: TrainBatch) -> None:
        self.learner_busy = False
        self.steps_done = batch.step + 1
        self.log.append(("step", batch.step))
        self._execute(self.gate.on_step(batch.step, batch), "on_step")
        self._start_learner()

    # --- checks -----------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Counts add up and every group is accounted for (call after ``run``)."""
        s = self.stats
        running = sum(len(g.running) for g in self.groups.values())
        if s["rollouts"] != s["finished"] + s["failed"] + s["aborted"] + running + s["lost_rollouts"]:
            raise AssertionError(f"rollouts do not add up: {s}, running={running}")
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
            if not (g.sealed or g.held or g.running or g.queued):
                raise AssertionError(f"group {g.group_id} is open with no verdict and nothing running")
        if self.cfg.fail_prob == 0 and s["dropped"]:
            raise AssertionError(f"{s['dropped']} committed groups had fewer than 2 rollouts without any failure")


def checkpoint_roundtrip(gate: Gate, make_gate: Callable[[], Gate]) -> Gate:
    """A fresh gate restored from ``gate``'s checkpoint, passed through JSON on the way."""
    state = json.loads(json.dumps(gate.state_dict()))
    restored = make_gate()
    restored.load_state_dict(state)
    return restored


def snap(group_id: int, prompt: Prompt | int, rewards: tuple[float, ...], in_flight: int = 0, failed: int = 0,
         target: int = 8) -> GroupSnapshot:
    """A hand-made snapshot for unit tests of one gate decision."""
    if isinstance(prompt, int):
        prompt = Prompt(prompt, f"p{prompt}", (prompt,))
    rewards = tuple(float(r) for r in rewards)
    return GroupSnapshot(group_id, prompt, target, rewards, in_flight, len(rewards) + in_flight + failed, failed,
                         10 * len(rewards), 0)


def pool_of(n: int, seed: int = 0):
    """A PromptPool of prompts 0..n-1 with the ids the harness uses."""
    from controller.prompts import PromptPool

    return PromptPool([Prompt(i, f"p{i}", (i,)) for i in range(n)], seed=seed)


def kinds(actions: list[GroupAction]) -> list[tuple[str, int, int]]:
    """(kind, group_id, n) of each action, for compact assertions."""
    return [(a.kind.value, a.group_id, a.n) for a in actions]
