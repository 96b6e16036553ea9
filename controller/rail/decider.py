"""Who acts at a decision point, and what gets logged about it: live vs shadow.

* **live**: the learned policy acts. Its SquareCB distribution goes through the live rule
  (intervene only when some intervention's predicted gain exceeds ``gain_threshold``; below it
  the intervention mass shrinks to ``below_threshold_explore`` of itself and the rest goes to
  the no-op) and the arm is sampled from the result. The logged propensity is that of the
  distribution actually sampled from; ``behaviour_propensity`` equals it (types.py's rule).
* **shadow**: the behaviour policy acts (its logged ``behaviour_propensity``). The learned
  policy -- its distribution after the live rule, i.e. what would act once promoted --
  gives the record's ``propensity``: its probability of that same executed arm, exactly the
  target propensity off-policy evaluation needs; its predicted gain for the arm is the
  record's ``predicted_gain``. The learned policy's own sampled choice is logged too, in the record's
  features under ``shadow.choice`` (index into ``actions``), ``shadow.choice_propensity`` and
  ``shadow.choice_gain``; replay strips every ``shadow.`` key from the context.

Either way the learner later learns from the executed arm with the acting policy's
propensity, and the promotion window gets the other policy's view of the same arm.

>>> from controller.rail.arms import build_arms
>>> from controller.rail.behaviour import NoneBehaviour
>>> from controller.rail.config import RailConfig
>>> from controller.rail.features import Context
>>> from controller.rail.river_backend import RiverLearner
>>> decider = Decider(RailConfig(), RiverLearner(seed=0), NoneBehaviour(0.0, seed=0), seed=0)
>>> ctx = Context.build("rescue", {"length_estimate": 0.1}, build_arms(RailConfig())[:3])
>>> choice = decider.choose(ctx, "shadow")
>>> choice.acted.arm, choice.behaviour_propensity, sorted(choice.extra_features)
('noop', 1.0, ['shadow.choice', 'shadow.choice_gain', 'shadow.choice_propensity'])
"""

from __future__ import annotations

import math
import operator
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from controller.rail.arms import Arm, ArmsCache
from controller.rail.bandit import BanditLearner, Decision, normalise, sample_index
from controller.rail.behaviour import BehaviourPolicy
from controller.rail.config import RailConfig
from controller.rail.features import Context

SHADOW_PREFIX = "shadow."
NO_EXTRA_FEATURES: Mapping[str, float] = MappingProxyType({})
"""A live choice's ``extra_features``: shared and read-only, not a new dict per decision."""
SMALL_BATCH = 4
"""``choose_many`` decides batches of at most this many contexts one at a time: the array path's
fixed cost (about 30 us) is more than it saves on a few rows (measured at 21 features, 11 arms)."""


@dataclass(frozen=True)
class Choice:
    """The executed decision and everything the log, the learner and the promoter need."""

    acted: Decision  # executed arm, with the acting policy's distribution and propensity
    propensity: float  # DecisionRecord.propensity (see the module docstring)
    behaviour_propensity: float  # DecisionRecord.behaviour_propensity
    predicted_gain: float  # the learned model's prediction for the executed arm
    other_prob: float  # the non-acting policy's probability of the executed arm
    q_other: float  # sum over arms of the non-acting policy's probability x predicted gain
    extra_features: Mapping[str, float] = field(default_factory=lambda: NO_EXTRA_FEATURES)  # shadow mode's ``shadow.*``


class Decider:
    """Applies the mode and the live rule; see the module docstring."""

    def __init__(self, config: RailConfig, learner: BanditLearner, behaviour: BehaviourPolicy, seed: int):
        self.config = config
        self.learner = learner
        self.behaviour = behaviour
        self._rng = random.Random(seed)
        self._splits = ArmsCache()

    @staticmethod
    def _split(arms: tuple[Arm, ...]) -> tuple[int | None, tuple[int, ...]]:
        """The no-op's index and the interventions'."""
        noop = next((i for i, a in enumerate(arms) if a.is_noop), None)
        return noop, tuple(i for i, a in enumerate(arms) if not a.is_noop)

    def live_distribution(
        self, context: Context, probs: tuple[float, ...], gains: tuple[float, ...]
    ) -> tuple[float, ...]:
        """The learned distribution after the live threshold rule."""
        noop, interventions = self._splits.get(context.arms, self._split)
        if noop is None or not interventions:
            return probs
        if max(map(gains.__getitem__, interventions)) > self.config.gain_threshold:
            return probs
        keep = self.config.below_threshold_explore
        out = list(probs)
        moved = 0.0
        for i in interventions:
            moved += out[i] * (1.0 - keep)
            out[i] *= keep
        out[noop] += moved
        return normalise(out)

    def choose(self, context: Context, mode: str) -> Choice:
        """The decision at ``context`` in ``mode`` (live or shadow)."""
        return self._choose(context, mode, *self.learner.distribution(context))

    def choose_many(self, contexts: list[Context], mode: str) -> list[Choice]:
        """``choose`` for every context, in order, with the learner scoring them in one call
        (in live mode the live rule and the sampling run on arrays, one block of contexts per
        arms tuple; the uniform draws are taken in the contexts' order, as ``choose`` would)."""
        if len(contexts) <= SMALL_BATCH:  # the single-context scorer costs less than a small block
            return [self.choose(c, mode) for c in contexts]
        if mode != "live":
            return [
                self._choose(c, mode, probs, gains)
                for c, (probs, gains) in zip(contexts, self.learner.distributions(contexts))
            ]
        draws = [self._rng.random() for _ in contexts]
        out: list[Choice | None] = [None] * len(contexts)
        for idx, probs, gains in self.learner.distribution_blocks(contexts):
            self._live_block(contexts, idx, probs, gains, draws, out)
        return out  # type: ignore[return-value]  # every index is in one block

    def _live_block(
        self,
        contexts: list[Context],
        idx: list[int],
        probs: np.ndarray,
        gains: np.ndarray,
        draws: list[float],
        out: list[Choice | None],
    ) -> None:
        """Live choices of one block of contexts that share their arms (rows of ``probs`` and
        ``gains``, contexts ``idx``) from their uniform draws, into ``out`` at ``idx``. The arrays
        become Python rows once per block, not once per row."""
        arms = contexts[idx[0]].arms
        acting = self._live_rows(arms, probs, gains)
        past = np.cumsum(acting, axis=1) > np.array([draws[i] for i in idx])[:, None]
        picks = past.argmax(axis=1)
        landed = past[np.arange(len(idx)), picks].tolist()
        other = self._behaviour_rows(contexts, idx, gains)
        names = contexts[idx[0]].names
        rows = zip(idx, picks.tolist(), landed, acting.tolist(), gains.tolist(), other)
        for i, j, hit, p_row, g_row, (behaviour, q) in rows:
            p_row, g_row = tuple(p_row), tuple(g_row)
            if not hit:  # rounding left u past the last sum
                j = max(a for a, p in enumerate(p_row) if p > 0)
            p, g = p_row[j], g_row[j]
            out[i] = Choice(
                acted=Decision(j, names[j], p, g, p_row, g_row),
                propensity=p,
                behaviour_propensity=p,
                predicted_gain=g,
                other_prob=behaviour[j],
                q_other=q if math.isfinite(q) else math.nan,
                extra_features=NO_EXTRA_FEATURES,
            )

    def _behaviour_rows(
        self, contexts: list[Context], idx: list[int], gains: np.ndarray
    ) -> list[tuple[tuple[float, ...], float]]:
        """Per row of a block: the behaviour policy's distribution at that row's own context and
        its expectation of the row's gains. The rule depends on the decision point, which the
        rows of one arms tuple need not share (a token point and an extend point with a prefix
        both offer every arm), so there is one product over the block per point present."""
        by_point: dict[str, tuple[tuple[float, ...], list[float]]] = {}
        rows = []
        for row, i in enumerate(idx):
            point = contexts[i].point
            found = by_point.get(point)
            if found is None:
                behaviour = self.behaviour.distribution(contexts[i])[0]
                found = by_point[point] = (behaviour, gains.dot(np.array(behaviour)).tolist())
            rows.append((found[0], found[1][row]))
        return rows

    def _live_rows(self, arms: tuple[Arm, ...], probs: np.ndarray, gains: np.ndarray) -> np.ndarray:
        """``live_distribution`` of every row of a block that shares ``arms``."""
        noop, interventions = self._splits.get(arms, self._split)
        if noop is None or not interventions:
            return probs
        cols = list(interventions)  # a copy by index, whose layout the row sums' rounding follows: not a slice
        below = ~(gains[:, cols].max(axis=1) > self.config.gain_threshold)  # a NaN gain counts as below
        if not below.any():
            return probs
        every = below.all()  # no mask to gather and scatter through (a run's first decisions: all gains ~0)
        out = probs.copy()
        keep = self.config.below_threshold_explore
        shrunk = out if every else out[below]
        moved = (shrunk[:, cols] * (1.0 - keep)).sum(axis=1)
        shrunk[:, cols] *= keep
        shrunk[:, noop] += moved
        if every:
            return _normalised_rows(shrunk)
        out[below] = _normalised_rows(shrunk)
        return out

    def _choose(self, context: Context, mode: str, probs: tuple[float, ...], gains: tuple[float, ...]) -> Choice:
        if mode == "live":
            acting = self.live_distribution(context, probs, gains)
            i = sample_index(acting, self._rng.random())
            acted = Decision(i, context.arms[i].name, acting[i], gains[i], acting, gains)
            behaviour = self.behaviour.distribution(context)[0]
            return Choice(
                acted=acted,
                propensity=acting[i],
                behaviour_propensity=acting[i],
                predicted_gain=gains[i],
                other_prob=behaviour[i],
                q_other=_expected(behaviour, gains),
                extra_features=NO_EXTRA_FEATURES,
            )
        if mode != "shadow":
            raise ValueError(f"mode={mode!r} must be 'live' or 'shadow'")
        # The policy that would act once promoted is the learned one under the live rule, so
        # that is the one whose choice and propensities are logged and evaluated.
        target = self.live_distribution(context, probs, gains)
        acted = self.behaviour.predict_one(context)
        i = acted.action
        j = sample_index(target, self._rng.random())  # the learned policy's own choice, logged only
        return Choice(
            acted=acted,
            propensity=target[i],
            behaviour_propensity=acted.propensity,
            predicted_gain=gains[i],
            other_prob=target[i],
            q_other=_expected(target, gains),
            extra_features={
                SHADOW_PREFIX + "choice": float(j),
                SHADOW_PREFIX + "choice_propensity": target[j],
                SHADOW_PREFIX + "choice_gain": gains[j],
            },
        )

    def state_dict(self) -> dict:
        version, internal, gauss = self._rng.getstate()
        return {"rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self._rng.setstate((int(version), tuple(int(x) for x in internal), gauss))


def _normalised_rows(probs: np.ndarray) -> np.ndarray:
    """``normalise`` of every row: non-finite and negative entries become 0, each row sums to 1
    (a row with nothing left becomes uniform)."""
    clean = np.where(np.isfinite(probs) & (probs > 0), probs, 0.0)
    total = clean.sum(axis=1, keepdims=True)
    empty = total[:, 0] <= 0
    if empty.any():
        clean[empty] = 1.0
        total[empty] = probs.shape[1]
    return clean / total


def _expected(probs: tuple[float, ...], gains: tuple[float, ...]) -> float:
    total = sum(map(operator.mul, probs, gains))
    return total if math.isfinite(total) else math.nan
