"""An empirical-Bayes Beta prior per difficulty level, fitted to the groups the run has seen.

A gate that starts every prompt from the uniform prior needs a probe of four rollouts before
an all-wrong prompt looks hopeless (SARA, G = 8: ``P_eff = 4/9`` after four failures, 2/3 after
two). But prompts of one difficulty level tend to stand alike: early in a run almost every
5-digit sum fails and almost every 1-digit sum passes. ``LevelPrior`` keeps, for each value of
``Prompt.difficulty``, the outcomes of the last ``window`` groups of that level (successes and
rollouts, whether the group was committed or abandoned) and fits a Beta(a, b) to them by the
method of moments of the beta-binomial:

* the level's mean ``m = (sum s + 1/2) / (sum n + 1)``;
* the spread of the prompts' true rates, ``v`` = the variance of the groups' observed rates
  ``s_i / n_i`` around ``m`` less the binomial noise ``m (1 - m) / n_i`` each carries;
* the intra-level correlation ``rho = v / (m (1 - m))``, which gives the prior's strength
  ``a + b = 1 / rho - 1``, clamped to ``[min_strength, max_strength]``.

A level of alike prompts gets a confident prior, and a group of it can be abandoned (or
committed) after fewer rollouts; a level of mixed prompts gets a weak, wide one, close to the
uniform. A level with fewer than ``min_groups`` groups seen gets ``fallback`` (the uniform).
The fit forgets: only the last ``window`` groups of a level count, so it follows the policy.

>>> prior = LevelPrior(window=32, min_groups=4)
>>> for _ in range(8):
...     prior.observe(5.0, successes=0, rollouts=4)   # hard: every probe fails
...     prior.observe(2.0, successes=3, rollouts=4)   # middling
...     prior.observe(2.0, successes=1, rollouts=4)
>>> [round(x, 2) for x in prior.prior(5.0)]  # confident: a rate near 0, worth 8 rollouts
[0.12, 7.88]
>>> [round(x, 2) for x in prior.prior(2.0)]  # the spread is binomial noise around 1/2
[4.0, 4.0]
>>> prior.prior(3.0)  # never seen: the fallback
(1.0, 1.0)
"""

from __future__ import annotations

from collections import deque
from typing import Any


class LevelPrior:
    """Per difficulty level, a Beta prior fitted to its recent groups; see the module docstring.

    Parameters
    ----------
    window
        Groups per level the fit keeps (the oldest is forgotten first).
    min_groups
        Groups of a level needed before its fit replaces ``fallback``.
    min_strength, max_strength
        Bounds on ``a + b``: the lower keeps a very split level from a prior so extreme that one
        rollout would decide; the upper keeps a level of identical groups from a prior that no
        evidence could move (the default 8: never worth more than a group of 8 rollouts).
    fallback
        The prior of a level with too few groups (the uniform by default).
    """

    def __init__(
        self,
        window: int = 64,
        min_groups: int = 16,
        min_strength: float = 0.5,
        max_strength: float = 8.0,
        fallback: tuple[float, float] = (1.0, 1.0),
    ):
        if window < 2:
            raise ValueError(f"window={window} must be >= 2 (a spread needs two groups)")
        if not 2 <= min_groups <= window:
            raise ValueError(f"min_groups={min_groups} must be in [2, window={window}]")
        if not 0 < min_strength <= max_strength:
            raise ValueError(f"strength bounds ({min_strength}, {max_strength}) must satisfy 0 < min <= max")
        self.window = window
        self.min_groups = min_groups
        self.min_strength = min_strength
        self.max_strength = max_strength
        self.fallback = (float(fallback[0]), float(fallback[1]))
        self._levels: dict[float, deque[tuple[int, int]]] = {}

    def observe(self, level: float, successes: int, rollouts: int) -> None:
        """One group of ``level`` ended with ``successes`` of ``rollouts`` (none: ignored)."""
        if rollouts <= 0:
            return
        if not 0 <= successes <= rollouts:
            raise ValueError(f"successes={successes} must be in [0, rollouts={rollouts}]")
        groups = self._levels.get(level)
        if groups is None:
            groups = self._levels[level] = deque(maxlen=self.window)
        groups.append((int(successes), int(rollouts)))

    def prior(self, level: float) -> tuple[float, float]:
        """The Beta (a, b) a new group of ``level`` starts from."""
        groups = self._levels.get(level)
        if groups is None or len(groups) < self.min_groups:
            return self.fallback
        total_s = sum(s for s, _ in groups)
        total_n = sum(n for _, n in groups)
        m = (total_s + 0.5) / (total_n + 1.0)
        noise = m * (1.0 - m)
        spread = sum((s / n - m) ** 2 for s, n in groups)
        # E[(s/n - m)^2] = v (1 - 1/n) + noise / n for a group of n: solve the sums for v.
        weight = sum(1.0 - 1.0 / n for _, n in groups)
        v = (spread - noise * sum(1.0 / n for _, n in groups)) / weight if weight > 0 else noise
        rho = min(max(v / noise, 0.0), 1.0)
        strength = self.max_strength if rho <= 0.0 else 1.0 / rho - 1.0
        strength = min(max(strength, self.min_strength), self.max_strength)
        return m * strength, (1.0 - m) * strength

    def state_dict(self) -> dict[str, Any]:
        return {"levels": [[level, [list(g) for g in groups]] for level, groups in self._levels.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        levels: dict[float, deque[tuple[int, int]]] = {}
        for level, groups in state["levels"]:
            levels[float(level)] = deque(((int(s), int(n)) for s, n in groups), maxlen=self.window)
        self._levels = levels
