"""Rounds of fresh prompts per learner step, with a round cap: what DS and Pilot-Commit share.

A round-based gate serves the step being filled (``StepQuota.fill_step``) with *rounds* of
``round_size`` fresh prompts. A new round opens only once every group of the previous one is
judged (and, by default, the step still needs groups), as DAPO's synchronous loop does. The
rounds serving one step form a *series*: which step, which round, plans of the round left to
open, groups of the round not yet judged, and whether the round cap's fallback is on.

Round cap: when round ``max_rounds`` of a step ends and the step is still short,
``on_round_cap="error"`` raises ``RoundCapError`` and ``"fill"`` turns the series' fallback on
(what a gate then does with its fallback candidates is its own).

``RoundGate`` keeps the quota, the series and the fallback candidates, opens the rounds in
``admit``, counts judged groups (``_count``), checks the cap (``_check_cap``) and checkpoints
all three; each group's ``RoundRecord`` says which step and round it serves and its verdict.
A subclass implements ``_update`` (calling ``_count`` once a group is judged, with the open
groups it was handed), ``_round_ended`` and ``_cap_message``; it may narrow ``_round_needed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from controller.gates.base import BaseGate
from controller.gates.common import GroupRecord, StepQuota
from controller.prompts import PromptPool
from controller.selectors import PromptSelector
from pipeline.protocols import OpenGroups
from pipeline.types import GroupAction, GroupPlan, GroupSnapshot


class RoundCapError(RuntimeError):
    """A gate ran ``max_rounds`` rounds for one step without filling its batch."""


@dataclass(kw_only=True)
class RoundRecord(GroupRecord):
    """A group of a round: the step and round it serves, whether the round cap's fallback was
    on when it opened, its verdict (an action kind, "" before one) and whether it is counted
    as judged in its round."""

    step: int
    round: int
    fallback: bool = False
    verdict: str = ""
    counted: bool = False


RR = TypeVar("RR", bound="RoundRecord")


class RoundGate(BaseGate[RR], Generic[RR]):
    """Round bookkeeping shared by the round-based gates (not a gate by itself).

    Parameters
    ----------
    source
        Where prompts come from.
    group_size
        G, the size of a committed group.
    batch_groups
        Groups per learner step (B_train).
    max_rounds
        Rounds per step before ``on_round_cap`` applies (>= 1).
    on_round_cap
        ``"fill"`` or ``"error"``.
    initial_size
        Rollouts each admitted group starts with.

    A subclass sets ``round_size``, the prompts per round, once it has checked its settings.

    Examples
    --------
    >>> from controller.gates.common import commit
    >>> from controller.prompts import PromptPool
    >>> from pipeline.types import GroupSnapshot, Prompt
    >>> class CommitAll(RoundGate):                    # commits every group, round after round
    ...     round_size = 2
    ...     def _update(self, snapshot, rec, groups):
    ...         self._quota.commit()
    ...         return [self._verdict(rec, commit(snapshot.group_id, "seen"))] + self._count(rec, groups)
    ...     def _round_ended(self, groups):
    ...         return []
    >>> gate = CommitAll(PromptPool([Prompt(i, "", (1,)) for i in range(9)], seed=0), group_size=4, batch_groups=4,
    ...                  max_rounds=3, on_round_cap="fill", initial_size=4)
    >>> plans = gate.admit(range(8), step=0)
    >>> len(plans), len(gate.admit(range(2, 10), step=0))   # a round of 2; the next waits for their verdicts
    (2, 0)
    >>> for plan in plans:
    ...     pilot = GroupSnapshot(plan.group_id, plan.prompt, 4, (1.0, 0.0, 1.0, 0.0), in_flight=0, launched=4,
    ...                           failed=0, tokens=0, policy_version=0)
    ...     _ = gate.update(pilot, {plan.group_id: pilot})
    >>> len(gate.admit(range(2, 10), step=0)), gate.state_dict()["series"]
    (2, {'step': 0, 'round': 2, 'to_open': 0, 'pending': 2, 'fallback': False})
    """

    round_size: int
    Record: type[RoundRecord] = RoundRecord

    def __init__(
        self,
        source: PromptPool | PromptSelector,
        group_size: int,
        batch_groups: int,
        max_rounds: int,
        on_round_cap: Literal["fill", "error"],
        initial_size: int,
    ):
        super().__init__(source, group_size)
        self.batch_groups = batch_groups
        self.max_rounds = max_rounds
        self.on_round_cap = on_round_cap
        self._initial_size = initial_size
        self._quota = StepQuota(batch_groups)
        self._series = {"step": -1, "round": 0, "to_open": 0, "pending": 0, "fallback": False}
        self._candidates: list[int] = []  # groups of the last allowed round held for on_round_cap=fill

    # --- admission ----------------------------------------------------------------------

    def admit(self, group_ids: range, step: int) -> list[GroupPlan]:
        self._quota.see_step(step)
        if not self._quota.can_commit():
            return []
        series = self._series
        if self._quota.fill_step > series["step"]:
            series.update(step=self._quota.fill_step, round=0, to_open=0, pending=0, fallback=False)
        if series["to_open"] == 0 and series["pending"] == 0:
            if not self._round_needed():
                return []
            series["round"] += 1
            series["to_open"] = self.round_size
        prompts = self.source.take(max(0, min(len(group_ids), series["to_open"])))
        series["to_open"] -= len(prompts)
        series["pending"] += len(prompts)
        plans = []
        for group_id, prompt in zip(group_ids, prompts):
            self._open(group_id, prompt, step=series["step"], round=series["round"], fallback=series["fallback"])
            plans.append(GroupPlan(group_id, prompt, self.group_size, self._initial_size))
        return plans

    def _round_needed(self) -> bool:
        """Whether the step needs another round once the last one is judged."""
        return True

    # --- rounds -------------------------------------------------------------------------

    def _in_round(self, rec: RoundRecord) -> bool:
        """The group belongs to the series' current round."""
        return rec.step == self._series["step"] and rec.round == self._series["round"]

    def _in_last_round(self, rec: RoundRecord) -> bool:
        """The group belongs to the last round the cap allows for the series' step."""
        return rec.round >= self.max_rounds and rec.step == self._series["step"]

    def _count(self, rec: RoundRecord, groups: OpenGroups) -> list[GroupAction]:
        """The group is judged: count it in its round (once); the actions of the round's end
        (on the open groups as ``groups`` holds them)."""
        counted, rec.counted = rec.counted, True
        series = self._series
        if not counted and self._in_round(rec):
            series["pending"] -= 1
            if series["pending"] == 0 and series["to_open"] == 0:
                return self._round_ended(groups)
        return []

    def _round_ended(self, groups: OpenGroups) -> list[GroupAction]:
        """Every group of the current round is judged (``groups``: the open groups as they stand)."""
        raise NotImplementedError

    def _stop_opening(self) -> None:
        """Open no more of the current round: it ends once its open groups are judged."""
        self._series["to_open"] = 0

    def _check_cap(self, short: bool) -> None:
        """A round ended with the step still ``short``: apply the cap if it was the last one."""
        series = self._series
        if short and series["round"] >= self.max_rounds and not series["fallback"]:
            self._verdicts.add("round_cap")
            if self.on_round_cap == "error":
                raise RoundCapError(self._cap_message())
            series["fallback"] = True

    def _cap_message(self) -> str:
        """The ``RoundCapError`` message: the shortfall and the settings that fix it."""
        raise NotImplementedError

    def _verdict(self, rec: RoundRecord, action: GroupAction) -> GroupAction:
        rec.verdict = action.kind.value
        self._verdicts.add(action.reason)
        return action

    # --- closing and checkpoint ---------------------------------------------------------

    def _closed(self, closing: GroupSnapshot, rec: RR, committed: bool) -> None:
        group_id = closing.group_id
        if rec.verdict == "commit" and not committed:
            self._quota.uncommit()  # dropped by the orchestrator: its place in the batch is free again
        if not rec.counted and self._in_round(rec):
            self._series["pending"] -= 1
        if group_id in self._candidates:
            self._candidates.remove(group_id)

    def _extra_state(self) -> dict[str, Any]:
        return {"quota": self._quota.state_dict(), "series": dict(self._series), "candidates": list(self._candidates)}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self._quota.load_state_dict(state["quota"])
        self._series = dict(state["series"])
        self._candidates = [int(g) for g in state["candidates"]]
