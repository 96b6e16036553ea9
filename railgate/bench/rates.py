"""Successes out of trials with a 95% Wilson interval, and how a report writes one as a table cell.

The recoverability benchmarks (``bench recover``, ``bench recover-turns``) count every rate
this way; samples of one prompt are correlated, so read an interval as a lower bound on the noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class Rate:
    """Successes out of trials, with a 95% Wilson interval.

    >>> r = Rate(30, 100)
    >>> round(r.rate, 2), [round(x, 3) for x in r.interval]
    (0.3, [0.219, 0.396])
    >>> Rate(0, 0).trials, Rate(0, 0).interval
    (0, (0.0, 1.0))
    """

    successes: int = 0
    trials: int = 0

    def add(self, success: bool) -> None:
        self.successes += int(success)
        self.trials += 1

    @property
    def rate(self) -> float:
        return self.successes / self.trials if self.trials else float("nan")

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.successes, self.trials)


def wilson(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% at z = 1.96)."""
    if trials == 0:
        return (0.0, 1.0)
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def rate_cell(r: dict[str, Any]) -> str:
    """A rate of a report (``successes``, ``trials``, ``rate``, ``ci95``) as a table cell.

    >>> rate_cell({"successes": 3, "trials": 10, "rate": 0.3, "ci95": [0.108, 0.603]})
    '0.300 [0.11, 0.60] (3/10)'
    >>> rate_cell({"successes": 0, "trials": 0, "rate": float("nan"), "ci95": [0.0, 1.0]})
    '-'
    """
    if not r["trials"]:
        return "-"
    lo, hi = r["ci95"]
    return f"{r['rate']:.3f} [{lo:.2f}, {hi:.2f}] ({r['successes']}/{r['trials']})"
