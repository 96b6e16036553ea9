"""Gain-prediction error of the online controller against a frozen copy of itself.

RAIL reports that its online controller (which keeps learning) predicts an intervention's
realised gain with over 40% less error than the same controller frozen after warm-up. After
``warmup_decisions`` learned decisions the controller snapshots its learner; from then on each
decision's outcome is compared with both predictions of the executed arm's reward, and this
tracker keeps the errors of the last ``window`` decisions that have both.

Two errors are reported, since the paper does not say which it means: the absolute error (its
wording) and the squared error (what VW's regressor minimises; the absolute error favours a
model that predicts the median, and realised gains are mostly near zero with rare large ones).

>>> t = GainErrorTracker(window=4)
>>> t.add(online=0.1, frozen=0.3, reward=0.0); t.add(online=0.2, frozen=0.2, reward=0.2)
>>> m = t.metrics()
>>> round(m["controller/gain_error_reduction"], 4), round(m["controller/gain_sq_error_reduction"], 4)
(0.6667, 0.8889)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _reduction(online: float, frozen: float) -> float:
    return 1.0 - online / frozen if frozen > 0 else math.nan


class GainErrorTracker:
    """Windowed mean absolute and squared errors of the online and frozen gain predictions."""

    def __init__(self, window: int = 1000):
        self.window = window
        self._online_all: deque[float] = deque(maxlen=window)  # every outcome, frozen copy or not
        self._pairs: deque[tuple[float, float]] = deque(maxlen=window)  # (online, frozen) signed errors

    def add(self, online: float, frozen: float, reward: float) -> None:
        """One outcome; ``frozen`` is NaN before the frozen copy exists."""
        if not math.isfinite(online) or not math.isfinite(reward):
            return
        self._online_all.append(online - reward)
        if math.isfinite(frozen):
            self._pairs.append((online - reward, frozen - reward))

    def metrics(self) -> dict[str, float]:
        out = {"controller/gain_error_online": _mean([abs(e) for e in self._online_all])}
        if not self._pairs:
            return out
        online_abs = _mean([abs(o) for o, _ in self._pairs])
        frozen_abs = _mean([abs(f) for _, f in self._pairs])
        online_sq = _mean([o * o for o, _ in self._pairs])
        frozen_sq = _mean([f * f for _, f in self._pairs])
        out.update(
            {
                "controller/gain_error_online_paired": online_abs,
                "controller/gain_error_frozen": frozen_abs,
                "controller/gain_error_reduction": _reduction(online_abs, frozen_abs),
                "controller/gain_sq_error_online": online_sq,
                "controller/gain_sq_error_frozen": frozen_sq,
                "controller/gain_sq_error_reduction": _reduction(online_sq, frozen_sq),
            }
        )
        return out

    def state_dict(self) -> dict:
        return {"online_all": list(self._online_all), "pairs": [list(p) for p in self._pairs]}

    def load_state_dict(self, state: dict) -> None:
        self._online_all = deque(map(float, state["online_all"]), maxlen=self.window)
        self._pairs = deque(((float(o), float(f)) for o, f in state["pairs"]), maxlen=self.window)
