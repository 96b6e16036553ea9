"""The bandit interface RAIL's learners share (river-style), and SquareCB's exploration rule.

``predict_one(context) -> Decision`` samples an arm from the learner's distribution and reports
its propensity and predicted gain; ``learn_one(context, decision, reward)`` learns from the arm
that was *taken* (the ``decision`` of whichever policy acted, with that policy's propensity);
``distribution(context)`` is the gain-regressor view: every arm's probability and predicted
gain, without sampling (the live threshold rule and off-policy estimates use it).

Backends subclass ``BanditLearner`` and implement ``_distribution`` / ``_learn`` and their
state; ``build_learner`` (``controller.rail.learners``) picks one from the config.

>>> probs = inverse_gap_weighting([0.0, 0.2, 0.1], gamma=10.0)
>>> [round(p, 4) for p in probs]
[0.2, 0.55, 0.25]
>>> round(sum(probs), 12)
1.0
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from controller.rail.arms import blocks_by_arms
from controller.rail.features import Context


@dataclass(frozen=True)
class Decision:
    """An arm chosen at a decision point.

    ``action`` indexes the context's arms; ``probabilities`` and ``predicted_gains`` are the
    chooser's distribution and gain estimates over all of them (``predicted_gains`` is all NaN
    for a policy without a reward model, such as a behaviour heuristic).
    """

    action: int
    arm: str
    propensity: float
    predicted_gain: float
    probabilities: tuple[float, ...]
    predicted_gains: tuple[float, ...]


class ControllerStateError(ValueError):
    """A controller or learner state (dict or file) is corrupt, foreign or of another version."""


def inverse_gap_weighting(gains: Sequence[float], gamma: float) -> list[float]:
    """SquareCB's distribution (Foster & Rakhlin 2020): every arm but the best gets
    ``1 / (K + gamma * (best_gain - gain))``, the best gets the rest. Every probability is
    positive, so the logs support importance weighting; larger ``gamma`` is greedier."""
    k = len(gains)
    if k == 0:
        raise ValueError("no arms to choose from; a decision needs at least one arm")
    top = max(gains)  # the first of equal gains is the best
    best = gains.index(top)
    probs = [1.0 / (k + gamma * (top - g)) for g in gains]
    probs[best] = 0.0
    probs[best] = 1.0 - sum(probs)
    return probs


def inverse_gap_weighting_rows(gains: np.ndarray, gamma: float) -> np.ndarray:
    """``inverse_gap_weighting`` of every row of ``gains`` (contexts x arms) at once.

    >>> rows = inverse_gap_weighting_rows(np.array([[0.0, 0.2, 0.1], [0.3, 0.3, 0.0]]), gamma=10.0)
    >>> [[round(p, 4) for p in row] for row in rows.tolist()]
    [[0.2, 0.55, 0.25], [0.5, 0.3333, 0.1667]]
    """
    m, k = gains.shape
    if k == 0:
        raise ValueError("no arms to choose from; a decision needs at least one arm")
    best = gains.argmax(axis=1)  # the first of equal gains, as the scalar rule
    rows = np.arange(m)
    probs = 1.0 / (k + gamma * (gains[rows, best][:, None] - gains))
    probs[rows, best] = 0.0
    probs[rows, best] = 1.0 - probs.sum(axis=1)
    return probs


def sample_index(probs: Sequence[float], u: float) -> int:
    """The arm that ``u`` in [0, 1) falls on in the cumulative distribution."""
    total = 0.0
    for i, p in enumerate(probs):
        total += p
        if u < total:
            return i
    return max(i for i, p in enumerate(probs) if p > 0)  # rounding left u past the last sum


def normalise(probs: Sequence[float]) -> tuple[float, ...]:
    """Probabilities scaled to sum to 1, with every entry finite and >= 0."""
    total = sum(probs)
    if 0.0 < total < math.inf and min(probs) >= 0.0:  # a NaN or an infinity makes the sum fail the test
        return tuple(p / total for p in probs)
    clean = [p if math.isfinite(p) and p > 0 else 0.0 for p in probs]
    total = sum(clean)
    if total <= 0:
        return tuple(1.0 / len(clean) for _ in clean)
    return tuple(p / total for p in clean)


class BanditLearner:
    """Base of RAIL's learners; subclasses implement ``_distribution``, ``_learn`` and state.

    Parameters
    ----------
    gamma_scale, gamma_exponent
        SquareCB exploration strength ``gamma = gamma_scale * (1 + learned) ** gamma_exponent``.
    seed
        Seeds the arm sampling of ``predict_one``.
    """

    name = "bandit"

    def __init__(self, gamma_scale: float = 10.0, gamma_exponent: float = 0.5, seed: int = 0):
        self.gamma_scale = gamma_scale
        self.gamma_exponent = gamma_exponent
        self.seed = seed
        self._rng = random.Random(seed)
        self._learned = 0

    # --- public ----------------------------------------------------------------------

    @property
    def learned(self) -> int:
        """Examples learned so far."""
        return self._learned

    def predict_one(self, context: Context) -> Decision:
        """Sample an arm from the learner's current distribution."""
        probs, gains = self.distribution(context)
        i = sample_index(probs, self._rng.random())
        return Decision(i, context.arms[i].name, probs[i], gains[i], probs, gains)

    def distribution(self, context: Context) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Every arm's probability and predicted gain (reward), without sampling."""
        if not context.arms:
            raise ValueError("context has no arms; a decision needs at least one arm")
        probs, gains = self._distribution(context)
        return normalise(probs), tuple(float(g) for g in gains)

    def distributions(self, contexts: Sequence[Context]) -> list[tuple[tuple[float, ...], tuple[float, ...]]]:
        """``distribution`` of each context; backends that can score many at once override it."""
        return [self.distribution(c) for c in contexts]

    def distribution_blocks(self, contexts: Sequence[Context]) -> list[tuple[list[int], np.ndarray, np.ndarray]]:
        """``distributions`` as arrays: one ``(indices, probabilities, gains)`` per arms tuple,
        the arrays (len(indices) x arms) in the order of ``indices`` into ``contexts``. This
        default stacks ``distributions``; a backend that scores in arrays overrides it."""
        rows = self.distributions(contexts)
        return [
            (
                idx,
                np.array([rows[i][0] for i in idx], dtype=np.float64),
                np.array([rows[i][1] for i in idx], dtype=np.float64),
            )
            for idx in blocks_by_arms(c.arms for c in contexts)
        ]

    def predict_gains(self, context: Context) -> tuple[float, ...]:
        """The gain-regressor view: predicted reward of every arm."""
        return self.distribution(context)[1]

    def learn_one(self, context: Context, decision: Decision, reward: float) -> None:
        """Learn from arm ``decision.action``, taken with probability ``decision.propensity``."""
        if not 0 <= decision.action < len(context.arms):
            raise ValueError(f"decision.action={decision.action} is outside the context's {len(context.arms)} arms")
        if not (0.0 < decision.propensity <= 1.0):
            raise ValueError(f"decision.propensity={decision.propensity} must be in (0, 1]")
        reward = float(reward)
        if not math.isfinite(reward):
            raise ValueError(f"reward={reward!r} is not finite; pass the realised gain of the decision")
        self._learn(context, decision, reward)
        self._learned += 1
        self._after_learn()

    def gamma(self) -> float:
        return self.gamma_scale * (1.0 + self._learned) ** self.gamma_exponent

    # --- state -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.name, "learned": self._learned, "rng": _rng_state(self._rng), **self._state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("kind") != self.name:
            found = state.get("kind") if isinstance(state, dict) else type(state).__name__
            raise ControllerStateError(
                f"learner state of kind {found!r} cannot be loaded into a {self.name!r} learner; "
                f"set controller.rail.backend to the backend that saved it"
            )
        try:
            self._learned = int(state["learned"])
            self._rng.setstate(_rng_from(state["rng"]))
            self._load(state)
        except ControllerStateError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ControllerStateError(
                f"{self.name} learner state is corrupt ({type(exc).__name__}: {exc}); delete the state "
                "file or start the controller fresh"
            ) from exc

    # --- for subclasses --------------------------------------------------------------

    def _distribution(self, context: Context) -> tuple[Sequence[float], Sequence[float]]:
        raise NotImplementedError

    def _learn(self, context: Context, decision: Decision, reward: float) -> None:
        raise NotImplementedError

    def _after_learn(self) -> None:
        """Called after every learned example (a backend's bookkeeping outside the decisions)."""

    def _state(self) -> dict[str, Any]:
        raise NotImplementedError

    def _load(self, state: dict[str, Any]) -> None:
        raise NotImplementedError


def _rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from(state: list) -> tuple:
    version, internal, gauss = state
    return (int(version), tuple(int(x) for x in internal), gauss)
