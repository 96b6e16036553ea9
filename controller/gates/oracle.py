"""The oracle gate, for benchmarks only: pays for no probe, no surplus, no abandoned group.

What it knows: ``success_probability(prompt_id)``, each prompt's exact success probability
under the current policy (the simulator's p_i; no real task has it). What it does not know:
the outcome of any rollout before the engine draws it.

Rule: for each prompt the pool offers, it draws the number of successes a group of G would
get, Binomial(G, p), from its own seeded generator -- a simulated foresight -- and opens a full
group, committed at once, only when that count is mixed (0 < count < G); other prompts are
skipped at no cost. So a prompt gets a group with probability
``pi(p) = 1 - p^G - (1 - p)^G``, the same prompts, in distribution, that a perfect-foresight
oracle pays for, and every opened group costs exactly G rollouts: per learner step
``batch_groups * G`` rollouts, the floor of any policy that trains on full groups of effective
prompts (DS pays ``rounds * oversample`` times more, so the oracle costs 0.33
of DS when DS needs one round a step; docs/methods.md, "The oracle"). Its realised groups are the engine's own draws,
effective with probability ``pi(p)`` each rather than always: benchmarks that count effective
groups read the perfect-foresight value ``G`` rollouts per effective group analytically and
this gate's measured value as the floor reachable from exact p alone. Every rollout it
launches runs like any other, but a group whose real draw turns out saturated is dropped and
its cost booked as *uncounted* (``gate/uncounted_rollouts``, ``gate/uncounted_tokens``):
perfect foresight would not have paid for it. Benchmarks subtract the uncounted cost, so the
floor's cost is exactly the rollouts of the effective groups it trains on.

If a whole pass over the pool finds no prompt with a mixed draw (every p is 0 or 1), ``admit``
returns what it found (possibly nothing) and ``exhausted`` is True until a later pass finds
one; the orchestrator then reports the stall ("pool exhausted").

**Hindsight mode** (``success_probability=None``, a real model, where no exact p exists): every
prompt the pool offers gets a full group, and the foresight is the group's own realised draw:
a saturated group is dropped and its cost booked as uncounted, exactly as above. The counted
cost is then exactly G rollouts per trained effective group -- the perfect-foresight floor --
at the price of really generating the dropped groups, so its *wall clock* is not a floor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from controller.gates.base import SealingGate
from controller.gates.common import SealedRecord, abandon
from controller.prompts import PromptPool
from controller.selectors import PromptSelector
from pipeline.types import GroupAction, GroupPlan, GroupSnapshot


@dataclass(kw_only=True)
class OracleRecord(SealedRecord):
    """An oracle group: ``saturated_cost`` (rollouts, tokens) once its draw turned out saturated."""

    saturated_cost: list[int] | None = None


class OracleGate(SealingGate[OracleRecord]):
    """Full groups only for prompts whose simulated group draw is mixed; see the module docstring.

    Parameters
    ----------
    source, group_size
        As for ``BaseGate``; every group it opens is a full group.
    success_probability
        ``success_probability(prompt_id) -> float``, the exact p under the current policy; None
        for hindsight mode (see the module docstring).
    seed
        Seed of the oracle's own draws.

    Examples
    --------
    >>> from pipeline.types import Prompt
    >>> from controller.prompts import PromptPool
    >>> p = {0: 0.0, 1: 0.5, 2: 1.0, 3: 0.5}
    >>> gate = OracleGate(PromptPool([Prompt(i, "", (1,)) for i in range(4)], seed=0), 8, p.__getitem__, seed=0)
    >>> sorted(plan.prompt.prompt_id for plan in gate.admit(range(2), step=0))   # never the p = 0 or 1 prompts
    [1, 3]
    >>> len(OracleGate(PromptPool([Prompt(i, "", (1,)) for i in range(4)], seed=0), 8, None, seed=0).admit(range(4), 0))
    4
    """

    name = "oracle"
    Record = OracleRecord

    def __init__(
        self,
        source: PromptPool | PromptSelector,
        group_size: int,
        success_probability: Callable[[int], float] | None,
        seed: int,
    ):
        if success_probability is not None and not callable(success_probability):
            raise TypeError(
                f"OracleGate needs success_probability(prompt_id) -> float (the simulator's exact p) or None "
                f"(hindsight mode), not {type(success_probability).__name__}"
            )
        super().__init__(source, group_size)
        self.success_probability = success_probability
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._barren = False
        self._uncounted_rollouts = 0
        self._uncounted_tokens = 0

    @property
    def exhausted(self) -> bool:
        return self._barren or super().exhausted

    def admit(self, group_ids: range, step: int) -> list[GroupPlan]:
        plans: list[GroupPlan] = []
        scanned = 0
        limit = max(self.source.active, 1)
        while len(plans) < len(group_ids) and scanned < limit:
            got = self.source.take(1)
            if not got:
                break
            prompt = got[0]
            scanned += 1
            if self.success_probability is not None:  # else hindsight: the realised draw decides in update()
                p = float(self.success_probability(prompt.prompt_id))
                if not 0.0 <= p <= 1.0:
                    raise ValueError(f"success_probability({prompt.prompt_id})={p} is not a probability")
                count = int(self._rng.binomial(self.group_size, p))
                if not 0 < count < self.group_size:
                    self.source.release(prompt.prompt_id)
                    self._verdicts.add("skip")
                    continue
            group_id = group_ids[len(plans)]
            self._open(group_id, prompt)
            plans.append(GroupPlan(group_id, prompt, self.group_size, self.group_size))
        self._barren = len(group_ids) > 0 and not plans and scanned >= limit
        return plans

    def _judge(self, snapshot: GroupSnapshot, rec: OracleRecord) -> list[GroupAction]:
        if snapshot.in_flight > 0 or snapshot.finished + snapshot.failed < snapshot.launched:
            return []  # judge the whole group
        if snapshot.is_mixed:
            return self._seal(snapshot.group_id, rec)
        # Perfect foresight would not have paid for this group: drop it and book its cost as
        # uncounted (once it is really gone: a controller may override the abandon), so the
        # floor's cost is the rollouts of the effective groups it trains on.
        rec.saturated_cost = [snapshot.launched, snapshot.tokens]
        self._verdicts.add("uncounted")
        return [abandon(snapshot.group_id, "oracle: saturated, uncounted")]

    def _closed(self, closing: GroupSnapshot, rec: OracleRecord, committed: bool) -> None:
        if not committed and rec.saturated_cost is not None:
            self._uncounted_rollouts += int(rec.saturated_cost[0])
            self._uncounted_tokens += int(rec.saturated_cost[1])

    @property
    def uncounted_rollouts(self) -> int:
        """Rollouts of dropped saturated groups: perfect foresight would not have paid for them."""
        return self._uncounted_rollouts

    def metrics(self) -> dict[str, float]:
        return {
            **super().metrics(),
            "gate/uncounted_rollouts": float(self._uncounted_rollouts),
            "gate/uncounted_tokens": float(self._uncounted_tokens),
        }

    def _extra_state(self) -> dict[str, Any]:
        return {
            "rng": self._rng.bit_generator.state,
            "barren": self._barren,
            "uncounted": [self._uncounted_rollouts, self._uncounted_tokens],
        }

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state["rng"]
        self._barren = bool(state["barren"])
        self._uncounted_rollouts, self._uncounted_tokens = (int(x) for x in state["uncounted"])
