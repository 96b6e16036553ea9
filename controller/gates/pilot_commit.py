"""Pilot-Commit (PC, arXiv 2605.26606, docs/methods.md): pilot a few rollouts, commit the mid-band.

1. Rounds of ``ceil(pilot_factor * batch_groups)`` fresh prompts (3x) get a pilot of
   ``pilot_size`` (n_p) rollouts each.
2. When a pilot is in, ``p_hat`` = its success rate. It is kept iff
   ``p_low <= p_hat <= 1 - p_up``; below the band it is deferred ("defer": too hard for now),
   above it skipped ("skip": too easy). Both are ABANDONed and cost what they cost.
3. ``p_hat >= p_solve`` counts toward eviction: after ``evict_after`` consecutive such pilots
   the prompt is evicted from the pool for good ("evict").
4. A kept pilot waits in a FIFO buffer (HOLD, nothing running) until a step has room; then it
   gets ``n_c = group_size - n_p`` more rollouts (LAUNCH) and is COMMITted: the training group
   is the pilot plus the new rollouts (pilots reused on-policy with no correction, as the
   paper does). Buffer entries more than ``max_buffer_age`` steps old are ABANDONed ("stale").
5. Every rollout is counted by the orchestrator, pilots of skipped prompts included.

A new pilot round opens when the previous one is judged and the step's remaining need is not
covered by the buffer. Round cap (``max_rounds`` per step), as in DS: ``"error"`` raises
``RoundCapError``; ``"fill"`` (default) keeps the out-of-band pilots of the last round that
are closest to p_hat = 0.5 (held for this) to fill the step, then pilots of further rounds are
all kept (except evicted prompts) until the step is covered. Once the held pilots cover the
step, the rest of that last round is not opened (as in DS). Commits follow ``StepQuota``:
exactly ``batch_groups`` per step. The rounds and the cap are kept by ``RoundGate``
(``controller.gates.rounds``).

Defaults, ours vs the paper: the released scripts pilot n_p = 16 or 32 for groups of 64 or 128
(a quarter of the group) and evict on one all-correct pilot (``evict_after = 1``). With groups
of 8 a pilot of 2 or 4 is all-correct by chance far too often: one all-correct pilot of 4
evicted 85-100% of the pool in a reference simulation. So our defaults are ``pilot_size = 4``
(half of G = 8) and ``evict_after = 2`` consecutive all-correct pilots; band 0.125 / 0.25,
``p_solve = 1.0``, ``max_buffer_age = 4`` and 3x pilots per round are the paper's.
``evict_after = 0`` turns eviction off. When every prompt is evicted, ``admit`` returns no
plan, ``exhausted`` turns True once the buffer is empty, and the orchestrator reports the stall
("the prompt pool may be exhausted or emptied by eviction").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from controller.config import PilotCommitConfig
from controller.gates.common import abandon, commit, hold, launch, too_many_failures
from controller.gates.rounds import RoundGate, RoundRecord
from controller.prompts import PromptPool
from controller.selectors import PromptSelector
from pipeline.protocols import OpenGroups
from pipeline.types import GroupAction, GroupSnapshot, TrainBatch


@dataclass(kw_only=True)
class PilotRecord(RoundRecord):
    """A pilot: its success rate ``p_hat`` as judged (the gate's verdict on it, kept as it was
    when judged), the horizon step at which it entered the buffer (``born``), why it would be
    abandoned while it is a fallback candidate (``reason``) and whether a controller's
    intervention made it be judged again. How many rollouts the pilot holds is the tracker's:
    a buffered group's commit reads it from the group's snapshot, to top the group up to size."""

    p_hat: float | None = None
    born: int | None = None
    reason: str = ""
    rejudge: bool = False


class PilotCommitGate(RoundGate[PilotRecord]):
    """Pilot, keep the mid-band, buffer, commit with the rest of the group; see the module docstring.

    Parameters
    ----------
    source
        Where prompts come from (a ``PromptPool``; evicted prompts are never offered again).
    group_size
        G = n_p + n_c, the size of a committed group.
    batch_groups
        Groups per learner step (B_train).
    config
        ``PilotCommitConfig``: the pilot size n_p, the keep band ``p_low <= p_hat <= 1 - p_up``,
        eviction (``p_solve``, ``evict_after``), the buffer's age limit, pilots per round as a
        multiple of ``batch_groups`` and the round cap, as in ``DynamicSamplingGate``.

    Examples
    --------
    >>> from pipeline.types import GroupSnapshot, Prompt
    >>> from controller.prompts import PromptPool
    >>> gate = PilotCommitGate(PromptPool([Prompt(i, "", (1,)) for i in range(6)], seed=0), group_size=8, batch_groups=1)
    >>> plans = gate.admit(range(6), step=0)
    >>> len(plans), (plans[0].target_size, plans[0].initial)
    (3, (8, 4))
    >>> pilot = GroupSnapshot(0, plans[0].prompt, 8, (1.0, 0.0, 1.0, 0.0), in_flight=0, launched=4, failed=0,
    ...                       tokens=0, policy_version=0)
    >>> [(a.kind.value, a.n) for a in gate.update(pilot, {0: pilot})]      # p_hat = 0.5: n_c = 4 more, then commit
    [('launch', 4), ('commit', 0)]
    """

    name = "pilot_commit"
    Record = PilotRecord

    def __init__(
        self,
        source: PromptPool | PromptSelector,
        group_size: int,
        batch_groups: int,
        config: PilotCommitConfig = PilotCommitConfig(),
    ):
        super().__init__(source, group_size, batch_groups, config.max_rounds, config.on_round_cap, config.pilot_size)
        config.check_sizes(group_size, batch_groups)
        self.config = config
        self.pilot_size = config.pilot_size
        self.p_low, self.p_up, self.p_solve = config.p_low, config.p_up, config.p_solve
        self.evict_after = config.evict_after
        self.max_buffer_age = config.max_buffer_age
        self.pilot_factor = config.pilot_factor
        self.round_size = math.ceil(config.pilot_factor * batch_groups)
        self._buffer: list[int] = []  # kept pilots waiting for a step with room, oldest first
        # self._candidates (RoundGate): out-of-band pilots of the last round (on_round_cap=fill)
        self._streak: dict[int, int] = {}  # prompt_id -> consecutive pilots at p_hat >= p_solve

    @property
    def exhausted(self) -> bool:
        return super().exhausted and not self._buffer and not self._candidates

    # --- admission ----------------------------------------------------------------------

    def _uncovered(self) -> int:
        """Groups the current series' step still needs beyond what the buffer holds."""
        if self._quota.fill_step > self._series["step"]:
            return 0
        return self._quota.need() - len(self._buffer)

    def _round_needed(self) -> bool:
        # When buffered pilots cover the step they commit at the next update or on_step.
        return self._uncovered() > 0

    # --- judging pilots -----------------------------------------------------------------

    def _update(self, snapshot: GroupSnapshot, rec: PilotRecord, groups: OpenGroups) -> list[GroupAction]:
        gid = snapshot.group_id
        if rec.verdict == "abandon":
            # A controller replaced our ABANDON by an intervention: judge the grown pilot again
            # (its eviction count already happened).
            rec.verdict, rec.rejudge = "", True
        if rec.verdict or snapshot.in_flight > 0:
            return []
        if snapshot.finished < self.pilot_size:
            if too_many_failures(snapshot):
                actions = [self._verdict(rec, abandon(gid, "failures"))]
            else:
                return [launch(gid, self.pilot_size - snapshot.finished, "replace failed")]
        else:
            actions = self._judge(snapshot, rec)
        actions += self._drain(groups)
        if rec.verdict == "" and gid in self._buffer:
            actions.append(self._verdict(rec, hold(gid, "buffered")))
        return actions + self._count(rec, groups)

    def _judge(self, snapshot: GroupSnapshot, rec: PilotRecord) -> list[GroupAction]:
        gid, pid = snapshot.group_id, snapshot.prompt.prompt_id
        p_hat = snapshot.successes / snapshot.finished
        rec.p_hat = p_hat
        if not rec.rejudge and self._evicts(pid, p_hat):
            return [self._verdict(rec, abandon(gid, "evict"))]
        if self.p_low <= p_hat <= 1.0 - self.p_up or rec.fallback:
            self._buffer.append(gid)
            rec.born = self._quota.horizon
            return []
        reason = "defer" if p_hat < self.p_low else "skip"
        if self.on_round_cap == "fill" and self._in_last_round(rec) and self._uncovered() > 0:
            self._candidates.append(gid)
            if len(self._candidates) >= self._uncovered():
                self._stop_opening()
            rec.reason = reason
            return [self._verdict(rec, hold(gid, "fallback_candidate"))]
        return [self._verdict(rec, abandon(gid, reason))]

    def _evicts(self, prompt_id: int, p_hat: float) -> bool:
        """Count a pilot toward eviction; True (and evicted) after ``evict_after`` in a row."""
        if p_hat < self.p_solve:
            self._streak.pop(prompt_id, None)
            return False
        self._streak[prompt_id] = self._streak.get(prompt_id, 0) + 1
        if not self.evict_after or self._streak[prompt_id] < self.evict_after:
            return False
        del self._streak[prompt_id]
        self.source.evict(prompt_id)
        return True

    def _drain(self, groups: OpenGroups) -> list[GroupAction]:
        """Commit buffered pilots, oldest first, while the step being produced has room, each
        topped up from the rollouts its snapshot holds now (``groups``) to the group size."""
        actions = []
        while self._buffer and self._quota.can_commit():
            gid = self._buffer.pop(0)
            rec = self._groups[gid]
            self._quota.commit()
            rest = self.group_size - groups[gid].finished
            if rest > 0:
                actions.append(launch(gid, rest, "pilot_commit n_c"))
            actions.append(self._verdict(rec, commit(gid, "commit")))
        return actions

    def _round_ended(self, groups: OpenGroups) -> list[GroupAction]:
        self._check_cap(short=self._uncovered() > 0)
        actions = []
        best = sorted(self._candidates, key=lambda g: (abs(self._judged(g) - 0.5), g))
        for gid in best:
            rec = self._groups[gid]
            if self._uncovered() > 0:
                self._buffer.append(gid)  # already held: it waits like any kept pilot
                rec.born = self._quota.horizon
                self._verdicts.add("fallback_kept")
            else:
                actions.append(self._verdict(rec, abandon(gid, rec.reason)))
        self._candidates = []
        actions += self._drain(groups)
        return actions

    def _judged(self, group_id: int) -> float:
        """A judged pilot's success rate (every fallback candidate was judged)."""
        p_hat = self._groups[group_id].p_hat
        assert p_hat is not None
        return p_hat

    def _cap_message(self) -> str:
        return (
            f"pilot-commit kept too few pilots for step {self._series['step']} ({self._uncovered()} groups short) in "
            f"gate.pilot_commit.max_rounds={self.max_rounds} rounds of {self.round_size} pilots; raise "
            "max_rounds or pilot_factor, widen the band (p_low, p_up), or set on_round_cap=fill"
        )

    # --- step boundary and closing ------------------------------------------------------

    def _stepped(self, step: int, batch: TrainBatch, groups: OpenGroups) -> list[GroupAction]:
        self._quota.see_step(step + 1)
        actions = []
        for gid in list(self._buffer):
            rec = self._groups[gid]
            assert rec.born is not None  # set when it entered the buffer
            if step + 1 - rec.born > self.max_buffer_age:
                self._buffer.remove(gid)
                actions.append(self._verdict(rec, abandon(gid, "stale")))
        return actions + self._drain(groups)

    def _closed(self, closing: GroupSnapshot, rec: PilotRecord, committed: bool) -> None:
        group_id = closing.group_id
        super()._closed(closing, rec, committed)
        if group_id in self._buffer:
            self._buffer.remove(group_id)

    def metrics(self) -> dict[str, float]:
        gauges = {"gate/buffer_now": float(len(self._buffer)), "gate/active_prompts": float(self.source.active)}
        return {**super().metrics(), **gauges}

    def _extra_state(self) -> dict[str, Any]:
        return {
            **super()._extra_state(),
            "buffer": list(self._buffer),
            "streak": {str(k): v for k, v in self._streak.items()},
        }

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        super()._load_extra_state(state)
        self._buffer = [int(g) for g in state["buffer"]]
        self._streak = {int(k): int(v) for k, v in state["streak"].items()}
