"""Bookkeeping the gates share: per-group records, step quotas, verdict counters.

A group's id is chosen when it is admitted (``Gate.admit`` takes the ids, each ``GroupPlan``
carries one, every ``GroupSnapshot`` of the group names it), so a gate keeps one typed
``GroupRecord`` per open group from its plan to its close.

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

import dataclasses
from collections import Counter
from typing import Any, TypeVar

from pipeline.types import ActionKind, GroupAction, GroupSnapshot

R = TypeVar("R", bound="GroupRecord")


@dataclasses.dataclass(kw_only=True)
class GroupRecord:
    """What a gate keeps about one open group: its prompt, and (in a subclass) the gate's own
    decisions on it. No counts of the group's samples: those are the tracker's, and the gate
    reads them from the snapshots it is handed (``update``, and ``on_closed``'s closing one).
    The checkpoint form is the plain dict of the fields.

    >>> @dataclasses.dataclass(kw_only=True)
    ... class Probe(GroupRecord):
    ...     phase: str = "probe"
    >>> rec = Probe.from_state({"prompt_id": 3, "s": 1, "plan_seq": 7})   # unknown keys are dropped
    >>> rec, rec.to_state()
    (Probe(prompt_id=3, phase='probe'), {'prompt_id': 3, 'phase': 'probe'})
    """

    prompt_id: int

    def to_state(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state(cls: type[R], state: dict[str, Any]) -> R:
        """The record of a checkpoint dict (earlier releases' extra keys, such as ``plan_seq``, are dropped)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in state.items() if k in names})


@dataclasses.dataclass(kw_only=True)
class SealedRecord(GroupRecord):
    """A group of a gate that commits once (DPS, the oracle): ``sealed`` once the gate's verdict
    was COMMIT (its decision, counted once; a controller may hold the COMMIT a while before the
    tracker seals the group)."""

    sealed: bool = False


class StepQuota:
    """``batch_groups`` commits per learner step, never past the step being produced."""

    def __init__(self, batch_groups: int):
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
