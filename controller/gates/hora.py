"""HORA (arXiv 2605.07114, docs/methods.md): probe a batch, then split the rest of its budget.

Per learner step HORA opens an *allocation batch* of ``batch_groups`` (B) prompts with
``probe_size`` (G0) rollouts each. Each group whose probe is in waits (HOLD). When the last
probe of the batch is in, the extra budget ``R = budget - B * G0`` (compute-matched to GRPO by
default: ``budget = B * G``) is split by ``controller.allocation.hora_allocate`` (greedy on the
hit utility, optimal) and every group of the batch gets ``LAUNCH m_i`` then ``COMMIT``. Groups
are of variable size ``G0 + m_i`` (``m_i`` may be 0), saturated ones included: HORA trains on
them unchanged (GRPO or RLOO). A plan's ``target_size`` is the nominal ``group_size``; a group's
real size is only known at allocation, and LAUNCH may take it past ``target_size``.

The next batch opens when the orchestrator asks for the next step (``admit``'s ``step`` or
``on_step``), so HORA needs ``B`` groups open at once (``orchestrator.max_open_groups >=
batch_groups``). A probe the engine failed on is relaunched; a group that fails
``target_size`` times is abandoned and replaced by a fresh prompt in the same batch. A
committed group the orchestrator drops (fewer than two valid rollouts) is replaced by a plain
group of ``group_size`` committed at once, so each step still gets B groups.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from controller.allocation import hora_allocate
from controller.config import HoraConfig
from controller.gates.base import BaseGate
from controller.gates.common import GroupRecord, abandon, commit, hold, launch, too_many_failures
from controller.prompts import PromptPool
from controller.selectors import PromptSelector
from pipeline.protocols import OpenGroups
from pipeline.types import GroupAction, GroupPlan, GroupSnapshot, TrainBatch


@dataclass(kw_only=True)
class HoraRecord(GroupRecord):
    """A HORA group: its ``phase`` (probe, wait, commit, abandoned; or replacement: a plain
    group owed for a dropped one) and the allocation batch it probes for. The probe's outcome
    is the tracker's: the batch's allocation reads each waiting group's snapshot when the
    batch's last probe ends."""

    phase: str
    batch: int | None = None


@dataclass
class AllocationBatch:
    """The allocation batch being probed: its index, plans still to open, the probed groups
    waiting for the rest, and whether its budget has been allocated."""

    index: int
    to_open: int
    ready: list[int] = field(default_factory=list)
    allocated: bool = False


class HoraGate(BaseGate[HoraRecord]):
    """Probe B prompts, then give the batch's remaining budget where a success is likeliest.

    Parameters
    ----------
    source
        Where prompts come from (a ``PromptPool``).
    group_size
        G, the nominal group size; with ``budget = 0`` the batch budget is ``B * G``.
    batch_groups
        B, prompts per allocation batch = groups per learner step.
    config
        ``HoraConfig``: the probe size G0, the batch budget (probes included; 0 = compute-matched
        ``B * G``) and the Beta prior.

    Examples
    --------
    >>> from pipeline.types import GroupSnapshot, Prompt
    >>> from controller.prompts import PromptPool
    >>> gate = HoraGate(PromptPool([Prompt(i, "", (1,)) for i in range(2)], seed=0), group_size=8, batch_groups=2)
    >>> a, b = gate.admit(range(4), step=0)
    >>> (a.target_size, a.initial), gate.extra_budget
    ((8, 4), 8)
    >>> def probed(plan, rewards):
    ...     return GroupSnapshot(plan.group_id, plan.prompt, 8, rewards, in_flight=0, launched=4, failed=0, tokens=0,
    ...                          policy_version=0)
    >>> open_groups = {a.group_id: probed(a, (0.0, 0.0, 0.0, 0.0))}     # the tracker's snapshots
    >>> [x.kind.value for x in gate.update(open_groups[a.group_id], open_groups)]
    ['hold']
    >>> open_groups[b.group_id] = probed(b, (1.0, 1.0, 1.0, 1.0))
    >>> [(x.kind.value, x.group_id, x.n) for x in gate.update(open_groups[b.group_id], open_groups)]
    [('launch', 0, 6), ('commit', 0, 0), ('launch', 1, 2), ('commit', 1, 0)]
    """

    name = "hora"
    Record = HoraRecord

    def __init__(
        self, source: PromptPool | PromptSelector, group_size: int, batch_groups: int, config: HoraConfig = HoraConfig()
    ):
        super().__init__(source, group_size)
        config.check_sizes(group_size, batch_groups)
        self.config = config
        self.batch_groups = batch_groups
        self.probe_size = config.probe_size
        self.budget = config.total_budget(group_size, batch_groups)
        self.extra_budget = self.budget - batch_groups * config.probe_size
        self.prior = (float(config.prior[0]), float(config.prior[1]))
        self._horizon = 0
        self._batch = AllocationBatch(index=0, to_open=batch_groups)
        self._replacements = 0  # plain groups owed for committed groups that were dropped

    # --- admission ----------------------------------------------------------------------

    def admit(self, group_ids: range, step: int) -> list[GroupPlan]:
        self._horizon = max(self._horizon, step)
        plans = []
        for group_id, prompt in zip(group_ids, self.source.take(max(0, min(len(group_ids), self._replacements)))):
            self._replacements -= 1
            self._open(group_id, prompt, phase="replacement")
            plans.append(GroupPlan(group_id, prompt, self.group_size, self.group_size))
        group_ids = group_ids[len(plans) :]
        batch = self._batch
        if batch.allocated:
            if batch.index + 1 > self._horizon:
                return plans
            self._batch = batch = AllocationBatch(index=batch.index + 1, to_open=self.batch_groups)
        for group_id, prompt in zip(group_ids, self.source.take(max(0, min(len(group_ids), batch.to_open)))):
            batch.to_open -= 1
            self._open(group_id, prompt, phase="probe", batch=batch.index)
            plans.append(GroupPlan(group_id, prompt, self.group_size, self.probe_size))
        return plans

    # --- probes and allocation ----------------------------------------------------------

    def _update(self, snapshot: GroupSnapshot, rec: HoraRecord, groups: OpenGroups) -> list[GroupAction]:
        gid = snapshot.group_id
        if rec.phase == "replacement":
            rec.phase = "commit"
            self._verdicts.add("replacement")
            return [commit(gid, "hora replacement")]
        if rec.phase == "abandoned":
            return [abandon(gid, "failures")]  # a controller replaced our ABANDON: propose it again
        if rec.phase == "wait" and snapshot.in_flight == 0:
            return [hold(gid, "await batch")]  # a controller added samples while it waited
        if rec.phase != "probe" or snapshot.in_flight > 0:
            return []
        if snapshot.finished < self.probe_size:
            if too_many_failures(snapshot):
                rec.phase = "abandoned"
                self._batch.to_open += 1  # a fresh prompt takes its place in the batch
                return self._abandon_failed(gid)
            return [launch(gid, self.probe_size - snapshot.finished, "replace failed")]
        rec.phase = "wait"
        self._batch.ready.append(gid)
        if self._batch.to_open == 0 and len(self._batch.ready) == self.batch_groups:
            return self._allocate(groups)
        return [hold(gid, "await batch")]

    def _allocate(self, groups: OpenGroups) -> list[GroupAction]:
        """Split the batch's extra budget by its probes' outcomes, each read from the group's
        snapshot as it stands (``groups``); every group of the batch commits."""
        ready = self._batch.ready
        recs = [self._groups[g] for g in ready]
        probed = [groups[g] for g in ready]  # each group of the batch as the tracker holds it now
        successes, probes = [p.successes for p in probed], [p.finished for p in probed]
        cap = [max(0, self.config.max_group_size - n) for n in probes] if self.config.max_group_size else None
        extra = hora_allocate(successes, probes, self.extra_budget, prior=self.prior, cap=cap)
        actions = []
        for gid, rec, m in zip(ready, recs, extra):
            rec.phase = "commit"
            if m > 0:
                actions.append(launch(gid, m, "hora extra"))
            actions.append(commit(gid, f"hora m={m}"))
        self._verdicts.add("commit", len(ready))
        self._verdicts.add("saturated_commit", sum(1 for s, n in zip(successes, probes) if s in (0, n)))
        self._batch.allocated = True
        return actions

    # --- step boundary and closing ------------------------------------------------------

    def _stepped(self, step: int, batch: TrainBatch, groups: OpenGroups) -> list[GroupAction]:
        self._horizon = max(self._horizon, step + 1)
        return []

    def _closed(self, closing: GroupSnapshot, rec: HoraRecord, committed: bool) -> None:
        group_id = closing.group_id
        if rec.phase in ("commit", "replacement") and not committed:
            self._replacements += 1  # owed again: the step still needs batch_groups groups
        elif rec.phase == "wait" and group_id in self._batch.ready:
            self._batch.ready.remove(group_id)
            self._batch.to_open += 1
        elif rec.phase == "probe" and rec.batch == self._batch.index:
            self._batch.to_open += 1

    def _extra_state(self) -> dict[str, Any]:
        return {"horizon": self._horizon, "batch": dataclasses.asdict(self._batch), "replacements": self._replacements}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self._horizon = int(state["horizon"])
        self._batch = AllocationBatch(**dict(state["batch"], ready=[int(g) for g in state["batch"]["ready"]]))
        self._replacements = int(state["replacements"])
