"""Behaviour policies: what acts in shadow mode while the learned controller watches.

* ``none``: always the no-op (the null controller, with exploration);
* ``arpo``: an ARPO-like heuristic (arXiv 2507.19849): at a high-entropy token of a running
  sample (a token decision point is one by construction) branch the prefix; on a rescue
  (the gate wants to abandon a saturated group) branch too, or resample when no prefix can be
  branched; when the gate commits, do nothing;
* ``guide``: the fixed guidance rule: on a rescue where guidance arms are on offer (the group's
  samples all failed and its prompt has a reference), guide at the level closest to 0.5;
  otherwise the no-op.

Both mix their rule with a uniformly random arm with probability ``epsilon``, so every arm has
a logged propensity of at least ``epsilon / K`` and importance weighting can evaluate any other
policy from their logs. Their ``distribution`` is exact, which is what the logged propensity
and the doubly-robust estimates need; they have no reward model (predicted gains are NaN).

>>> from controller.rail.arms import build_arms
>>> from controller.rail.config import RailConfig
>>> from controller.rail.features import Context
>>> arms = build_arms(RailConfig(branch_sizes=(2,), branch_temperatures=(1.0,), resample_sizes=()))
>>> ctx = Context.build("token", {"length_estimate": 0.1}, arms)
>>> ArpoBehaviour(epsilon=0.2, seed=0).distribution(ctx)[0]
(0.1, 0.9)
>>> NoneBehaviour(epsilon=0.2, seed=0).distribution(ctx)[0]
(0.9, 0.1)
"""

from __future__ import annotations

import math
import random

from controller.rail.arms import ArmsCache
from controller.rail.bandit import Decision, sample_index
from controller.rail.config import RailConfig
from controller.rail.features import Context


class BehaviourPolicy:
    """A fixed rule mixed with uniform exploration; subclasses pick the rule's arm."""

    name = "behaviour"

    def __init__(self, epsilon: float = 0.2, seed: int = 0):
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon={epsilon} must be in [0, 1]")
        self.epsilon = epsilon
        self.seed = seed
        self._rng = random.Random(seed)
        self._cache = ArmsCache()

    def rule(self, context: Context) -> int:
        """Index of the arm the rule picks."""
        raise NotImplementedError

    def distribution(self, context: Context) -> tuple[tuple[float, ...], tuple[float, ...]]:
        k = len(context.arms)
        if k == 0:
            raise ValueError("context has no arms; a decision needs at least one arm")
        # The rule depends on the point and the arms only.
        return self._cache.get(context.arms, lambda _arms: self._distribution(context, k), context.point)

    def _distribution(self, context: Context, k: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        probs = [self.epsilon / k] * k
        probs[self.rule(context)] += 1.0 - self.epsilon
        return tuple(probs), (math.nan,) * k

    def predict_one(self, context: Context) -> Decision:
        probs, gains = self.distribution(context)
        i = sample_index(probs, self._rng.random())
        return Decision(i, context.arms[i].name, probs[i], math.nan, probs, gains)

    def state_dict(self) -> dict:
        version, internal, gauss = self._rng.getstate()
        return {"kind": self.name, "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self._rng.setstate((int(version), tuple(int(x) for x in internal), gauss))


class NoneBehaviour(BehaviourPolicy):
    """Always the no-op (exploring with probability ``epsilon``)."""

    name = "none"

    def rule(self, context: Context) -> int:
        return noop_index(context)


def noop_index(context: Context) -> int:
    """The index of the no-op arm (the first arm if there is none)."""
    for i, arm in enumerate(context.arms):
        if arm.is_noop:
            return i
    return 0


class ArpoBehaviour(BehaviourPolicy):
    """Branch at high-entropy tokens and on rescues (exploring with probability ``epsilon``).

    The branch it prefers is the smallest one at the temperature closest to ``temperature``
    (ARPO samples its branches at the policy's own temperature).
    """

    name = "arpo"

    def __init__(self, epsilon: float = 0.2, seed: int = 0, temperature: float = 1.0):
        super().__init__(epsilon, seed)
        self.temperature = temperature

    def _preferred(self, context: Context, kind: str) -> int | None:
        best, best_key = None, None
        for i, arm in enumerate(context.arms):
            if arm.kind == kind:
                key = (arm.n, abs(arm.temperature - self.temperature), arm.temperature)
                if best_key is None or key < best_key:
                    best, best_key = i, key
        return best

    def rule(self, context: Context) -> int:
        noop = noop_index(context)
        if context.point == "extend":
            return noop
        branch = self._preferred(context, "branch")
        if branch is not None:
            return branch
        if context.point == "rescue":
            resample = self._preferred(context, "resample")
            if resample is not None:
                return resample
        return noop


class GuideBehaviour(BehaviourPolicy):
    """Guide every rescue it can at the level closest to ``level`` (exploring with probability
    ``epsilon``): the fixed rule "guide all-wrong groups at 50%".

    >>> from controller.rail.arms import build_arms
    >>> arms = build_arms(RailConfig(branch_sizes=(), resample_sizes=(), token_decisions=False,
    ...                              guide_levels=(0.25, 0.5, 0.75)))
    >>> probs = GuideBehaviour(epsilon=0.0).distribution(Context.build("rescue", {"length_estimate": 0.1}, arms))[0]
    >>> arms[probs.index(1.0)].name
    'guide_n4_l0.5'
    """

    name = "guide"

    def __init__(self, epsilon: float = 0.2, seed: int = 0, level: float = 0.5):
        super().__init__(epsilon, seed)
        self.level = level

    def rule(self, context: Context) -> int:
        guides = [(abs(a.level - self.level), i) for i, a in enumerate(context.arms) if a.kind == "guide"]
        if context.point != "rescue" or not guides:
            return noop_index(context)
        return min(guides)[1]


def build_behaviour(config: RailConfig, seed: int) -> BehaviourPolicy:
    """The behaviour policy ``config.behaviour`` with ``config.behaviour_epsilon``."""
    if config.behaviour == "none":
        return NoneBehaviour(config.behaviour_epsilon, seed)
    if config.behaviour == "arpo":
        return ArpoBehaviour(config.behaviour_epsilon, seed)
    if config.behaviour == "guide":
        return GuideBehaviour(config.behaviour_epsilon, seed)
    raise ValueError(f"controller.rail.behaviour={config.behaviour!r} must be 'none', 'arpo' or 'guide'")
