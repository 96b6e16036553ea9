"""The gate and the controller on the tracker's groups: what they decide, and the trace of it.

``Deciders`` asks the gate and then the controller about a group after each of its scored
samples (``gate.update`` -> ``controller.on_group``), holds a gate proposal back while the
controller has queued its own decision on that group, decides the controller's queued
decision points as one batch when they are due, and logs every gate decision to the trace
with whether it ran. It decides; the tracker (``pipeline.core.tracker``) carries the actions out.

The gate reads the groups it decides on from the tracker's records: ``update`` and ``on_step``
are handed a ``pipeline.core.group.SnapshotView`` of the tracker's open groups, read as
snapshots on demand (``pipeline.protocols.OpenGroups``), so no gate keeps a copy of a group's
counts.

Queued decision points (RAIL batches its decisions) wait until the tracking loop has taken the
messages already waiting -- the points of one tick then share one batch -- but at most
``DECIDE_WITHIN_EVENTS`` messages.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from pipeline.core.decisions import NullSink, gate_decision
from pipeline.core.group import GroupRun, SnapshotView
from pipeline.core.hooktimer import HookTimer
from pipeline.core.samples import Samples
from pipeline.protocols import Controller, DecisionSink, Gate
from pipeline.types import ActionKind, GroupAction, GroupSnapshot, TrainBatch, TurnPoint

DECIDE_WITHIN_EVENTS = 64
"""Queued decision points wait at most this many tracking-loop messages for their batch."""


class Deciders:
    """One run's gate and controller on the tracker's open ``groups``, their held proposals and
    their trace records."""

    def __init__(
        self,
        gate: Gate,
        controller: Controller,
        samples: Samples,
        groups: Mapping[int, GroupRun],
        *,
        run_id: str,
        hook_timer: HookTimer | None,
        now: Callable[[], float],
        policy_version: Callable[[], int],
    ):
        self.gate, self.controller, self.samples = gate, controller, samples
        self.groups = groups
        self.open = SnapshotView(groups, self.snapshot)  # what the gate reads the open groups from
        self.run_id, self.hook_timer = run_id, hook_timer
        self.now, self.policy_version = now, policy_version
        self.token_hooks = controller.wants_tokens
        self._held: dict[int, list[GroupAction]] = {}  # gate proposals the controller holds until its batch is decided
        self._flush_sent = False
        self._events_since_flush = 0
        self.attach_trace(None)

    def attach_trace(self, trace: DecisionSink | None) -> None:
        self.trace = trace if trace is not None else NullSink()
        self._records = not isinstance(self.trace, NullSink)

    @property
    def queued(self) -> int:
        """Decision points the controller queued and has not decided yet."""
        return self.controller.queued_decisions

    def on_sample(self, group: GroupRun) -> Sequence[GroupAction]:
        """A sample of ``group`` was scored: the actions to execute, in order (they may name
        any open group: HORA decides a whole batch at its last probe)."""
        started = time.perf_counter_ns() if self.hook_timer is not None else 0
        snapshot = self.snapshot(group)
        proposed = [] if group.sealed else self.gate.update(snapshot, self.open)
        final = self.controller.on_group(snapshot, proposed)
        if self.hook_timer is not None:
            self.hook_timer.record(time.perf_counter_ns() - started)
        # A HOLD the gate did not propose: the controller queued a decision on this group and
        # holds the gate's proposal until its batch is decided (``decide_queued``).
        deferred = (
            () if final is proposed else {a.group_id for a in final if a.kind is ActionKind.HOLD and a not in proposed}
        )
        for action in proposed:
            if action.group_id in deferred and action not in final:
                self._held.setdefault(action.group_id, []).append(action)
            else:
                # The trace says what the gate proposed and whether it ran (the controller may
                # replace an abandon by an intervention).
                self.log(action, executed=action in final)
        return final

    def decide_queued(self) -> Sequence[GroupAction]:
        """The decision points the controller queued, decided now in one batch. A held gate
        proposal is logged now, as executed when the controller's actions include it."""
        self._flush_sent = False
        self._events_since_flush = 0
        actions = self.controller.flush_decisions()
        held, self._held = self._held, {}
        for proposals in held.values():
            for action in proposals:
                self.log(action, executed=action in actions)
        return actions

    def flush_wanted(self) -> bool:
        """True once per batch of decision points queued on the stream side (a ``DecideQueued``
        then wakes the tracking loop, which decides them once due)."""
        if self._flush_sent or not self.token_hooks or not self.queued:
            return False
        self._flush_sent = True
        return True

    def decide_due(self, backlog: int) -> bool:
        """Queued points are decided when no message waits behind this one (the points of this
        tick are in), or after ``DECIDE_WITHIN_EVENTS`` messages, so that a loop that never
        drains still decides them."""
        self._events_since_flush += 1
        return backlog == 0 or self._events_since_flush >= DECIDE_WITHIN_EVENTS

    def on_turn(self, group: GroupRun, sample_index: int, point: TurnPoint) -> Sequence[GroupAction]:
        """An episode of ``group`` reached a turn boundary: the controller may act there."""
        if group.closed:
            return ()
        return self.controller.on_turn(self.snapshot(group), sample_index, point)

    def snapshot(self, group: GroupRun) -> GroupSnapshot:
        """The group as the gate and the controller see it now."""
        return group.snapshot(self.policy_version(), self.samples.in_flight(group.group_id))

    def on_step(self, batch: TrainBatch) -> Sequence[GroupAction]:
        """The learner trained on ``batch``: the gate may act on its open groups (logged)."""
        actions = self.gate.on_step(batch.step, batch, self.open)
        for action in actions:
            self.log(action)
        return actions

    def forget(self, group_id: int) -> None:
        """The group closed: a proposal held for it is void."""
        self._held.pop(group_id, None)

    def log(self, action: GroupAction, executed: bool = True) -> None:
        """One gate decision on an open group into the trace (its id kept for the outcome)."""
        group = self.groups.get(action.group_id)
        if group is None:
            return
        decision_id = self.trace.next_decision_id()
        group.note_decision(decision_id)
        if self._records:  # a NullSink keeps none: do not build them
            self.trace.log_decision(
                gate_decision(
                    decision_id,
                    action,
                    prompt=group.prompt,
                    rewards=group.rewards,
                    in_flight=self.samples.started_in(group.group_id),
                    launched=group.launched,
                    target_size=group.target_size,
                    executed=executed,
                    time=self.now(),
                    run_id=self.run_id,
                    policy_version=self.policy_version(),
                )
            )
