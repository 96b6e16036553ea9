"""Committed groups waiting for the learner, and where one learner step ends.

``StepCutter`` holds the groups the tracker shipped, in order, and the batches sent to the
learner and not yet trained. A step is ``batch_groups`` groups, as the papers define it; or,
with ``batch_rollouts`` N > 0, the shortest run of pending groups after which the rollouts
spent since the run began (abandoned groups' included, each attached to the next commit)
reach (step + 1) * N. What one step spends beyond its share is taken off the next, so a
budget buys the same number of optimiser steps whatever the gate abandons.

>>> from pipeline.types import CommittedGroup
>>> def group(i):
...     return CommittedGroup(group_id=i, prompt_id=i, rollouts=(), launched=4, tokens=0)
>>> cut = StepCutter(batch_groups=2, batch_rollouts=10)
>>> cut.abandoned(4)                       # an abandoned probe: its 4 rollouts join the next commit
>>> cut.committed(group(0), launched=4)    # 8 rollouts spent
>>> cut.next_batch(steps=5) is None
True
>>> cut.committed(group(1), launched=4)    # 12 >= 10: the step ends here, 2 over
>>> batch = cut.next_batch(steps=5); cut.sent(batch)
>>> batch.step, len(batch.groups), cut.overshoot
(0, 2, 2)
"""

from __future__ import annotations

from collections import deque
from typing import Any

from pipeline.types import CommittedGroup, TrainBatch


class StepCutter:
    """Pending committed groups, their rollout costs, and the batches in the learner's hands."""

    def __init__(self, batch_groups: int, batch_rollouts: int = 0):
        self.batch_groups = batch_groups
        self.batch_rollouts = batch_rollouts
        self.pending: list[CommittedGroup] = []  # shipped groups waiting to fill a batch
        # Rollout cost of each pending group: its own launches plus those of the groups
        # abandoned since the previous commit.
        self._cost: list[int] = []
        self._loose = 0  # rollouts of groups abandoned since the last commit
        self.overshoot = 0  # rollouts the batches sent so far spent beyond their steps' share
        self.batches_sent = 0
        self.untrained: deque[TrainBatch] = deque()  # sent to the learner, not trained yet
        self._untrained_costs: deque[list[int]] = deque()

    # --- what the tracker reports ----------------------------------------------------------

    def committed(self, group: CommittedGroup, launched: int) -> None:
        """``group`` shipped; it cost ``launched`` rollouts of its own."""
        self.pending.append(group)
        self._cost.append(self._loose + launched)
        self._loose = 0

    def abandoned(self, launched: int) -> None:
        """A group closed without shipping after ``launched`` rollouts."""
        self._loose += launched

    # --- cutting batches -------------------------------------------------------------------

    def batch_len(self) -> int:
        """How many pending groups the next batch takes (0: not enough yet)."""
        if not self.batch_rollouts:
            b = self.batch_groups
            return b if len(self.pending) >= b else 0
        need = self.batch_rollouts - self.overshoot
        spent = 0
        for i, cost in enumerate(self._cost):
            spent += cost
            if spent >= need:
                return i + 1
        return 0

    def next_batch(self, steps: int) -> TrainBatch | None:
        """The next batch when the pending groups fill one and the run needs one (of ``steps``);
        the groups leave only at ``sent``."""
        n = self.batch_len()
        if not n or self.batches_sent >= steps:
            return None
        return TrainBatch(step=self.batches_sent, groups=tuple(self.pending[:n]))

    def cut(self) -> TrainBatch:
        """A batch of every pending group, full or not (a step cut short), sent at once."""
        batch = TrainBatch(step=self.batches_sent, groups=tuple(self.pending))
        self.sent(batch)
        return batch

    def sent(self, batch: TrainBatch) -> None:
        """``batch`` (from ``next_batch``) is on its way to the learner."""
        n = len(batch.groups)
        del self.pending[:n]
        costs, self._cost = self._cost[:n], self._cost[n:]
        self._untrained_costs.append(costs)
        if self.batch_rollouts:
            self.overshoot += sum(costs) - self.batch_rollouts
        self.batches_sent += 1
        self.untrained.append(batch)

    def trained(self, step: int) -> None:
        """The learner finished the batch of ``step``."""
        if self.untrained and self.untrained[0].step == step:
            self.untrained.popleft()
            self._untrained_costs.popleft()

    def describe(self) -> str:
        """What a batch needs, for error messages."""
        if not self.batch_rollouts:
            return f"{self.batch_groups}"
        return f"{self.batch_rollouts} rollouts, {sum(self._cost) + self._loose} spent"

    # --- checkpoint ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Untrained batches are kept whole and cut again on resume."""
        return {
            "untrained_batches": [b.groups for b in self.untrained],
            "pending": list(self.pending),
            # each untrained group's rollout cost, in the order load_state_dict puts them back
            "pending_cost": [c for costs in self._untrained_costs for c in costs] + self._cost,
            "loose_cost": self._loose,
            "overshoot": self.overshoot - sum(sum(c) - self.batch_rollouts for c in self._untrained_costs)
            if self.batch_rollouts
            else 0,
        }

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Resume after ``step`` trained steps: committed groups never trained go first."""
        self.batches_sent = step
        self.pending = [g for groups in state["untrained_batches"] for g in groups] + list(state["pending"])
        cost = state.get("pending_cost")  # absent from checkpoints written before batch_rollouts
        self._cost = (
            list(cost) if cost is not None and len(cost) == len(self.pending) else [g.launched for g in self.pending]
        )
        self._loose = int(state.get("loose_cost", 0))
        self.overshoot = int(state.get("overshoot", 0))
