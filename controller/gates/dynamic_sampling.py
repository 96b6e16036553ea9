"""DAPO dynamic sampling (DS): oversample full groups, keep the effective ones.

For each learner step DS opens *rounds* of ``ceil(oversample * batch_groups)`` prompts (3x by
default), each with a full group of G. When a group has all its samples it is judged:

* reward std 0 (all-same)                     -> ABANDON ("zero_std"; its cost stays counted);
* effective, and the step still needs groups  -> COMMIT;
* effective, the step already full            -> ABANDON ("surplus"), as DAPO discards it;
  or, with ``keep_surplus=True``, HOLD it and COMMIT it for the next step at ``on_step``
  (at most ``batch_groups`` are held; the rest are abandoned).

A new round opens only once every group of the previous round is judged and the step still
needs groups, as DAPO's synchronous loop does (the whole round is generated; its surplus is
paid for). Round sizes stay fixed, like DAPO's generation batch.

Round cap (``max_rounds`` per step): if the last allowed round ends and the step is still
short, ``on_round_cap`` decides:

* ``"error"``: raise ``RoundCapError`` naming the shortfall and the knobs (DAPO's behaviour);
* ``"fill"`` (default): the all-same groups of that last round, held for this purpose instead
  of abandoned, fill the rest of the batch (best available: they cost nothing more); if they
  are not enough, further rounds commit every finished group with two or more valid samples,
  like uniform GRPO, until the step is full. ``gate/round_cap`` counts these events. Once the
  held groups cover what the step still needs, the rest of that round is not opened: held
  groups count against the orchestrator's step-ahead room, so it might never open.

Commits follow ``StepQuota`` (``controller.gates.common``): exactly ``batch_groups`` per step.
The rounds and the cap are kept by ``RoundGate`` (``controller.gates.rounds``).
"""

from __future__ import annotations

import math
from typing import Any

from controller.config import DsConfig
from controller.gates.common import abandon, commit, hold
from controller.gates.rounds import RoundGate, RoundRecord
from controller.prompts import PromptPool
from controller.selectors import PromptSelector
from pipeline.protocols import OpenGroups
from pipeline.types import GroupAction, GroupSnapshot, TrainBatch


class DynamicSamplingGate(RoundGate[RoundRecord]):
    """DAPO dynamic sampling with a round cap; see the module docstring.

    Parameters
    ----------
    source, group_size
        As for ``BaseGate``; every group is a full group.
    batch_groups
        Groups per learner step (B_train).
    config
        ``DsConfig``: prompts per round as a multiple of ``batch_groups`` (DAPO: 3), the round
        cap and what happens at it, whether surplus effective groups are held for the next step.

    Examples
    --------
    >>> from pipeline.types import GroupSnapshot, Prompt
    >>> from controller.prompts import PromptPool
    >>> pool = PromptPool([Prompt(i, "", (1,)) for i in range(8)], seed=0)
    >>> gate = DynamicSamplingGate(pool, group_size=4, batch_groups=1)
    >>> plans = gate.admit(range(8), step=0)
    >>> len(plans)                                   # one round: 3 x batch_groups prompts
    3
    >>> def done(gid, prompt, rewards):
    ...     snapshot = GroupSnapshot(gid, prompt, 4, rewards, in_flight=0, launched=4, failed=0, tokens=0,
    ...                              policy_version=0)
    ...     return gate.update(snapshot, {gid: snapshot})
    >>> [a.reason for a in done(0, plans[0].prompt, (0.0, 0.0, 0.0, 0.0))]
    ['zero_std']
    >>> [a.reason for a in done(1, plans[1].prompt, (1.0, 0.0, 0.0, 1.0))]
    ['effective']
    >>> [a.reason for a in done(2, plans[2].prompt, (0.0, 1.0, 1.0, 1.0))]
    ['surplus']
    """

    name = "ds"

    def __init__(
        self, source: PromptPool | PromptSelector, group_size: int, batch_groups: int, config: DsConfig = DsConfig()
    ):
        super().__init__(
            source, group_size, batch_groups, config.max_rounds, config.on_round_cap, initial_size=group_size
        )
        self.config = config
        self.oversample = config.oversample
        self.round_size = math.ceil(config.oversample * batch_groups)
        self.keep_surplus = config.keep_surplus
        self._held: list[int] = []  # surplus kept for a later step (keep_surplus)
        # self._candidates (RoundGate): all-same groups of the last round, for on_round_cap=fill

    # --- judging ------------------------------------------------------------------------

    def _update(self, snapshot: GroupSnapshot, rec: RoundRecord, groups: OpenGroups) -> list[GroupAction]:
        if rec.verdict == "abandon":
            rec.verdict = ""  # a controller replaced our ABANDON by an intervention: judge again
        if rec.verdict or snapshot.in_flight > 0:
            return []
        return [self._judge(snapshot, rec)] + self._count(rec, groups)

    def _may_commit(self, rec: RoundRecord) -> bool:
        return self._quota.can_commit() and self._quota.fill_step <= rec.step

    def _judge(self, snapshot: GroupSnapshot, rec: RoundRecord) -> GroupAction:
        gid = snapshot.group_id
        if snapshot.finished < 2:
            return self._verdict(rec, abandon(gid, "too_few_valid"))
        if snapshot.is_mixed or rec.fallback:
            if self._may_commit(rec):
                self._quota.commit()
                return self._verdict(rec, commit(gid, "effective" if snapshot.is_mixed else "fallback"))
            if snapshot.is_mixed and self.keep_surplus and len(self._held) < self.batch_groups:
                self._held.append(gid)
                return self._verdict(rec, hold(gid, "surplus_held"))
            return self._verdict(rec, abandon(gid, "surplus" if snapshot.is_mixed else "zero_std"))
        if self.on_round_cap == "fill" and self._in_last_round(rec) and self._may_commit(rec):
            self._candidates.append(gid)
            if len(self._candidates) >= self._quota.need():
                self._stop_opening()
            return self._verdict(rec, hold(gid, "fallback_candidate"))
        return self._verdict(rec, abandon(gid, "zero_std"))

    def _round_ended(self, groups: OpenGroups) -> list[GroupAction]:
        filled = self._quota.fill_step > self._series["step"]
        self._check_cap(short=not filled)
        actions = []
        for gid in self._candidates:
            rec = self._groups[gid]
            if not filled and self._may_commit(rec):
                self._quota.commit()
                actions.append(self._verdict(rec, commit(gid, "fallback")))
            else:
                actions.append(self._verdict(rec, abandon(gid, "zero_std")))
        self._candidates = []
        return actions

    def _cap_message(self) -> str:
        step = self._series["step"]
        have = self._quota.committed - step * self.batch_groups
        return (
            f"dynamic sampling found {have}/{self.batch_groups} effective groups for step {step} "
            f"in gate.ds.max_rounds={self.max_rounds} rounds of {self.round_size} prompts; raise "
            "gate.ds.max_rounds or gate.ds.oversample, or set gate.ds.on_round_cap=fill to fill the "
            "batch with the best groups available"
        )

    # --- step boundary and closing ------------------------------------------------------

    def _stepped(self, step: int, batch: TrainBatch, groups: OpenGroups) -> list[GroupAction]:
        self._quota.see_step(step + 1)
        actions = []
        while self._held and self._quota.can_commit():
            gid = self._held.pop(0)
            self._quota.commit()
            actions.append(self._verdict(self._groups[gid], commit(gid, "surplus_committed")))
        return actions

    def _closed(self, closing: GroupSnapshot, rec: RoundRecord, committed: bool) -> None:
        group_id = closing.group_id
        super()._closed(closing, rec, committed)
        if group_id in self._held:
            self._held.remove(group_id)

    def metrics(self) -> dict[str, float]:
        gauges = {"gate/held_now": float(len(self._held)), "gate/rounds_this_step": float(self._series["round"])}
        return {**super().metrics(), **gauges}

    def _extra_state(self) -> dict[str, Any]:
        return {**super()._extra_state(), "held": list(self._held)}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        super()._load_extra_state(state)
        self._held = [int(g) for g in state["held"]]
