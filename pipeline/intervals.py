"""Held-out accuracy as a mean over prompts, and its 95% intervals with the prompt as the unit.

The samples of one prompt are not independent: a prompt the policy solves tends to be solved in
every sample, so a binomial interval over all samples is too narrow by the design effect
(about 2x on the project's model with 4 samples a prompt). Here the unit is the prompt:

* ``prompt_mean(rates)``: accuracy is the mean over prompts of each prompt's success rate (with
  the same number of samples for every prompt, exactly the share of successful samples), and
  its interval is Student's t over those per-prompt rates,
  ``mean ± t(0.975, P - 1) * sd / sqrt(P)``. Why t and not a bootstrap: it is deterministic
  (no seed to carry), cheap, and with the hundreds of prompts an evaluation has the mean of
  rates bounded in [0, 1] is close to normal; a bootstrap gives the same width to within a few
  percent there.
* ``paired_difference(a, b)``: two policies evaluated on the same prompts with the same random
  draws (``pipeline.evaluation``): the per-prompt differences ``a_i - b_i``, averaged, with the
  t interval over prompts. Common draws remove the sampling noise the two evaluations share, so
  this interval is much narrower than the two accuracies' intervals side by side; a policy
  against itself gives exactly 0 with the interval [0, 0].
* ``seeds_and_prompts(d)``: a benchmark's differences ``d[s][i]`` for seeds s (independent
  training runs) and prompts i (shared by every seed). Under a two-way random-effects model
  (``d = mu + seed effect + prompt effect + noise``) the grand mean's variance is at most
  ``var(seed means) / S + var(prompt means) / P``; that bound is used, with Welch-Satterthwaite
  degrees of freedom for the t quantile. With one seed it is ``paired_difference``'s interval.

Prompts without a rate (every sample left out by the reward: ``nan``) are dropped; a paired
comparison drops a prompt missing on either side. With a single prompt there is no interval
(``nan`` bounds).

>>> e = prompt_mean([1.0, 0.5, 0.0, 0.5])
>>> e.mean, round(e.lo, 4), round(e.hi, 4), e.n
(0.5, -0.1496, 1.1496, 4)
>>> paired_difference([1.0, 0.5, 0.25], [1.0, 0.5, 0.25])
Interval(mean=0.0, lo=0.0, hi=0.0, n=3)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import stdtrit

LEVEL = 0.95
"""Coverage of every interval here."""


@dataclass(frozen=True)
class Interval:
    """A mean and its 95% interval; ``n`` is the number of units (prompts) it rests on.

    >>> Interval(0.4, 0.37, 0.43, 512).text()
    '0.400 (95% 0.370 to 0.430)'
    """

    mean: float
    lo: float
    hi: float
    n: int

    def text(self, digits: int = 3) -> str:
        """``mean (95% lo to hi)``, for tables and reports."""
        return f"{self.mean:.{digits}f} (95% {self.lo:.{digits}f} to {self.hi:.{digits}f})"


def _t(df: float) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom."""
    return float(stdtrit(df, 0.5 + LEVEL / 2)) if math.isfinite(df) else 1.959963984540054


def _t_interval(mean: float, variance_of_mean: float, df: float, n: int) -> Interval:
    if n < 2 or not math.isfinite(variance_of_mean):
        return Interval(mean, math.nan, math.nan, n)
    half = _t(df) * math.sqrt(variance_of_mean) if variance_of_mean > 0 else 0.0
    return Interval(mean, mean - half, mean + half, n)


def prompt_mean(rates: Sequence[float]) -> Interval:
    """The mean over prompts of per-prompt success rates, with the t interval over prompts.

    >>> prompt_mean([0.25, 0.25, 0.25])
    Interval(mean=0.25, lo=0.25, hi=0.25, n=3)
    >>> prompt_mean([float("nan"), 1.0, 0.0]).n
    2
    """
    x = np.asarray(rates, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if x.size < 2:
        return Interval(mean, math.nan, math.nan, int(x.size))
    return _t_interval(mean, float(x.var(ddof=1)) / x.size, x.size - 1, int(x.size))


def paired_difference(a: Sequence[float], b: Sequence[float]) -> Interval:
    """``mean(a_i - b_i)`` over the prompts both have, with the t interval over prompts.

    ``a`` and ``b`` are per-prompt rates of the same prompts, in the same order, drawn with
    the same random numbers.

    >>> d = paired_difference([1.0, 0.5, 0.75, 0.5], [0.75, 0.5, 0.5, 0.25])
    >>> d.mean, round(d.lo, 4), round(d.hi, 4)
    (0.1875, -0.0114, 0.3864)
    >>> paired_difference([1.0], [1.0, 0.0])
    Traceback (most recent call last):
    ...
    ValueError: paired rates need the same prompts: 1 against 2 rates
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired rates need the same prompts: {x.size} against {y.size} rates")
    return prompt_mean(x - y)  # nan where either is missing: dropped there


def seeds_and_prompts(differences: Sequence[Sequence[float]]) -> Interval:
    """The mean of ``differences[s][i]`` (seed s, prompt i) with a 95% interval over both seeds
    and prompts (see the module docstring); ``n`` counts prompts. Prompts missing in any seed
    are dropped.

    >>> d = [[0.1, 0.0, 0.2, 0.1], [0.0, 0.1, 0.1, 0.2], [0.1, 0.1, 0.2, 0.0]]
    >>> e = seeds_and_prompts(d)
    >>> round(e.mean, 4), round(e.lo, 4), round(e.hi, 4), e.n
    (0.1, 0.025, 0.175, 4)
    >>> seeds_and_prompts([[0.5, 0.0, 0.25]]) == paired_difference([0.5, 0.0, 0.25], [0.0, 0.0, 0.0])
    True
    """
    d = np.asarray(differences, dtype=float)
    if d.ndim != 2 or d.size == 0:
        raise ValueError(f"differences must be seeds x prompts, got shape {d.shape}")
    d = d[:, np.isfinite(d).all(axis=0)]
    seeds, prompts = d.shape
    if seeds == 1:
        return prompt_mean(d[0])
    if prompts == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(d.mean())
    v_seeds = float(d.mean(axis=1).var(ddof=1)) / seeds
    v_prompts = float(d.mean(axis=0).var(ddof=1)) / prompts if prompts > 1 else 0.0
    variance = v_seeds + v_prompts
    if variance <= 0:
        return Interval(mean, mean, mean, prompts)
    # Welch-Satterthwaite: the two variance estimates have S - 1 and P - 1 degrees of freedom.
    parts = v_seeds**2 / (seeds - 1) + (v_prompts**2 / (prompts - 1) if prompts > 1 else 0.0)
    df = variance**2 / parts if parts > 0 else math.inf
    return _t_interval(mean, variance, df, prompts)
