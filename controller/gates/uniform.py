"""Uniform GRPO: every prompt gets a full group of G samples, all of which are trained on."""

from __future__ import annotations

from typing import Any

from controller.prompts import PromptPool
from pipeline.protocols import Gate, OpenGroups
from pipeline.types import ActionKind, GroupAction, GroupPlan, GroupSnapshot, TrainBatch


class UniformGate(Gate):
    """The GRPO baseline: open a group of ``group_size`` per prompt and commit it at once
    (``orchestrator.group_size``, which ``OrchestratorConfig`` checks is at least 2).

    Examples
    --------
    >>> from pipeline.types import Prompt
    >>> gate = UniformGate(PromptPool([Prompt(i, "", (1,)) for i in range(4)], seed=0), group_size=8)
    >>> plans = gate.admit(range(2), step=0)
    >>> [(p.group_id, p.target_size, p.initial) for p in plans]
    [(0, 8, 8), (1, 8, 8)]
    """

    abandons = False  # every group commits: admission opens only what the remaining steps train on

    def __init__(self, pool: PromptPool, group_size: int):
        self.pool = pool
        self.group_size = group_size
        # Groups whose COMMIT it proposed: its own decisions, not their state. The snapshot cannot
        # say it: a controller that holds the COMMIT (RAIL's queued decisions) leaves the group
        # unsealed (``committed_at`` -1) until it decides, and asks the gate again meanwhile.
        self._proposed: set[int] = set()

    def admit(self, group_ids: range, step: int) -> list[GroupPlan]:
        return [
            GroupPlan(gid, p, self.group_size, self.group_size)
            for gid, p in zip(group_ids, self.pool.take(len(group_ids)))
        ]

    def update(self, snapshot: GroupSnapshot, groups: OpenGroups) -> list[GroupAction]:
        # Asked only while the group is not committed (the tracker's rule): commit it, once. While
        # a controller holds that COMMIT the group is still open, and a second proposal would be a
        # second decision point for one verdict.
        if snapshot.group_id in self._proposed:
            return []
        self._proposed.add(snapshot.group_id)
        return [GroupAction(ActionKind.COMMIT, snapshot.group_id, reason="uniform")]

    def on_closed(self, closing: GroupSnapshot, committed: bool) -> None:
        self._proposed.discard(closing.group_id)

    def on_step(self, step: int, batch: TrainBatch, groups: OpenGroups) -> list[GroupAction]:
        return []

    def state_dict(self) -> dict[str, Any]:
        return {"pool": self.pool.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool.load_state_dict(state["pool"])
