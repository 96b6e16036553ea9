"""Bookkeeping the gates share: matching groups to plans, step quotas, verdict counters.

The orchestrator (``pipeline/protocols.py``) numbers a group only when it opens it, so a gate
meets a group's id at the group's first ``update``. ``PlanBook`` keeps what the gate meant for
each plan (a small JSON-able dict) per prompt, first in first out, and hands it back then.

``StepQuota`` is for gates that want each learner step's batch to hold exactly their chosen
``batch_groups`` groups (DS, Pilot-Commit, HORA). It counts commits and knows how far the
orchestrator has asked: the step passed to ``admit`` is the batch being filled, and
``on_step(t)`` means step t + 1 is under way. A commit lands in step ``committed //
batch_groups`` and is allowed only up to that horizon, so a gate never commits ahead of the
batch being produced. A committed group the orchestrator dropped (fewer than two valid
rollouts) gives its place back.

>>> quota = StepQuota(batch_groups=2)
>>> quota.see_step(0); quota.commit(); quota.commit()
>>> quota.fill_step, quota.can_commit()
(1, False)
>>> quota.see_step(1); quota.can_commit(), quota.need()
(True, 2)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pipeline.types import ActionKind, GroupAction, GroupSnapshot


class PlanBook:
    """What a gate planned for each group it asked to open, until the group's id is known.

    A group can also close before it ever reported: a resumed run closes every group that was
    open at the checkpoint (``pipeline.orchestrator``), including ones whose first sample never
    ended. ``pop_oldest`` hands back a plan for such a group; which of the unreported plans it
    is does not matter, since all of them are closed together.
    """

    def __init__(self) -> None:
        self._pending: dict[int, list[dict[str, Any]]] = {}
        self._seq = 0

    def __len__(self) -> int:
        return sum(len(v) for v in self._pending.values())

    def add(self, prompt_id: int, plan: dict[str, Any]) -> None:
        self._pending.setdefault(prompt_id, []).append(dict(plan, prompt_id=prompt_id, plan_seq=self._seq))
        self._seq += 1

    def pop_oldest(self) -> dict[str, Any] | None:
        """The oldest unreported plan (None when there is none)."""
        if not self._pending:
            return None
        prompt_id = min(self._pending, key=lambda k: self._pending[k][0]["plan_seq"])
        queue = self._pending[prompt_id]
        plan = queue.pop(0)
        if not queue:
            del self._pending[prompt_id]
        return plan

    def claim(self, snapshot: GroupSnapshot, gate: str) -> dict[str, Any]:
        """The oldest plan for the snapshot's prompt; its group has just reported."""
        queue = self._pending.get(snapshot.prompt.prompt_id)
        if not queue:
            raise ValueError(
                f"{gate} got an update for group {snapshot.group_id} of prompt {snapshot.prompt.prompt_id}, "
                "which it never opened; only the gate that admitted a group may be asked about it"
            )
        plan = queue.pop(0)
        if not queue:
            del self._pending[snapshot.prompt.prompt_id]
        return plan

    def state_dict(self) -> dict[str, Any]:
        return {"seq": self._seq, "pending": {str(k): [dict(p) for p in v] for k, v in self._pending.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._seq = int(state["seq"])
        self._pending = {int(k): [dict(p) for p in v] for k, v in state["pending"].items()}


class StepQuota:
    """``batch_groups`` commits per learner step, never past the step being produced."""

    def __init__(self, batch_groups: int):
        if batch_groups < 1:
            raise ValueError(f"batch_groups={batch_groups} must be >= 1")
        self.batch_groups = batch_groups
        self.committed = 0
        self.horizon = 0

    @property
    def fill_step(self) -> int:
        """The step the next commit lands in."""
        return self.committed // self.batch_groups

    def see_step(self, step: int) -> None:
        """The orchestrator is producing ``step`` (or later)."""
        self.horizon = max(self.horizon, step)

    def can_commit(self) -> bool:
        return self.fill_step <= self.horizon

    def need(self) -> int:
        """Commits the fill step still takes now (0 while it is beyond the horizon)."""
        return self.batch_groups - self.committed % self.batch_groups if self.can_commit() else 0

    def commit(self) -> None:
        self.committed += 1

    def uncommit(self) -> None:
        self.committed -= 1

    def state_dict(self) -> dict[str, Any]:
        return {"committed": self.committed, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.committed = int(state["committed"])
        self.horizon = int(state["horizon"])


class Verdicts:
    """Counts of a gate's decisions by reason, reported as ``gate/<reason>`` metrics."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def add(self, reason: str, n: int = 1) -> None:
        self.counts[reason] += n

    def metrics(self) -> dict[str, float]:
        return {f"gate/{k}": float(v) for k, v in sorted(self.counts.items())}

    def state_dict(self) -> dict[str, Any]:
        return dict(self.counts)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = Counter({str(k): int(v) for k, v in state.items()})


def launch(group_id: int, n: int, reason: str) -> GroupAction:
    return GroupAction(ActionKind.LAUNCH, group_id, n=n, reason=reason)


def commit(group_id: int, reason: str) -> GroupAction:
    return GroupAction(ActionKind.COMMIT, group_id, reason=reason)


def abandon(group_id: int, reason: str) -> GroupAction:
    return GroupAction(ActionKind.ABANDON, group_id, reason=reason)


def hold(group_id: int, reason: str) -> GroupAction:
    return GroupAction(ActionKind.HOLD, group_id, reason=reason)


def too_many_failures(snapshot: GroupSnapshot) -> bool:
    """The engine failed on as many samples as the group's target size: stop paying for it."""
    return snapshot.failed >= max(snapshot.target_size, 2)
