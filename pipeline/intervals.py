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
  degrees of freedom for the t quantile, from ``MIN_SEEDS`` seeds on. With fewer seeds the
  seed-to-seed variance rests on one or two degrees of freedom (a t quantile of 12.7 at one),
  which says nothing: the interval is then over prompts only, of the seeds' mean per prompt,
  and says so (``Interval.scope == "prompts"``): the seed-to-seed part is left unresolved.
* ``over_seeds(values)``: one number per seed (a paired difference per seed), the t interval
  over seeds from ``MIN_SEEDS`` seeds on; fewer: no interval.

Every interval stays within the range its values can take (``bounds``: [0, 1] for an accuracy,
[-1, 1] for a difference of accuracies): the mean lies there, so a bound past it covers nothing
more.

Prompts without a rate (every sample left out by the reward: ``nan``) are dropped; a paired
comparison drops a prompt missing on either side. With a single prompt there is no interval
(``nan`` bounds).

>>> e = prompt_mean([1.0, 0.5, 0.0, 0.5])
>>> e.mean, round(e.lo, 4), round(e.hi, 4), e.n
(0.5, 0.0, 1.0, 4)
>>> paired_difference([1.0, 0.5, 0.25], [1.0, 0.5, 0.25])
Interval(mean=0.0, lo=0.0, hi=0.0, n=3)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.special import stdtrit

LEVEL = 0.95
"""Coverage of every interval here."""

MIN_SEEDS = 3
"""Fewest seeds an interval over seeds is given from: below, the seed-to-seed variance has one
degree of freedom (or none), and its t quantile (12.7) makes any interval meaningless."""

RATES = (0.0, 1.0)
"""The range of an accuracy (a success rate)."""
DIFFERENCES = (-1.0, 1.0)
"""The range of a difference of two accuracies."""


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
    scope: str = field(default="", repr=False)
    """What the interval is over when that is less than the caller asked for: ``"prompts"`` when
    ``seeds_and_prompts`` had too few seeds for their part; empty otherwise."""

    def text(self, digits: int = 3) -> str:
        """``mean (95% lo to hi)``, for tables and reports."""
        return f"{self.mean:.{digits}f} (95% {self.lo:.{digits}f} to {self.hi:.{digits}f})"


def _t(df: float) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom."""
    return float(stdtrit(df, 0.5 + LEVEL / 2)) if math.isfinite(df) else 1.959963984540054


def _t_interval(
    mean: float, variance_of_mean: float, df: float, n: int, bounds: tuple[float, float], scope: str = ""
) -> Interval:
    if n < 2 or not math.isfinite(variance_of_mean):
        return Interval(mean, math.nan, math.nan, n, scope)
    half = _t(df) * math.sqrt(variance_of_mean) if variance_of_mean > 0 else 0.0
    return Interval(mean, max(bounds[0], mean - half), min(bounds[1], mean + half), n, scope)


def _mean_interval(values: Sequence[float], bounds: tuple[float, float], scope: str = "") -> Interval:
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0, scope)
    mean = float(x.mean())
    if x.size < 2:
        return Interval(mean, math.nan, math.nan, int(x.size), scope)
    return _t_interval(mean, float(x.var(ddof=1)) / x.size, x.size - 1, int(x.size), bounds, scope)


def prompt_mean(rates: Sequence[float]) -> Interval:
    """The mean over prompts of per-prompt success rates, with the t interval over prompts
    (within [0, 1]).

    >>> prompt_mean([0.25, 0.25, 0.25])
    Interval(mean=0.25, lo=0.25, hi=0.25, n=3)
    >>> prompt_mean([float("nan"), 1.0, 0.0]).n
    2
    >>> prompt_mean([1.0, 1.0, 1.0, 0.75]).hi  # t alone would reach 1.08
    1.0
    """
    return _mean_interval(rates, RATES)


def over_seeds(values: Sequence[float], bounds: tuple[float, float] = DIFFERENCES) -> Interval:
    """The mean of one value per seed with its t interval over seeds (within ``bounds``), or no
    interval (``nan`` bounds) below ``MIN_SEEDS`` seeds; ``n`` counts seeds.

    >>> over_seeds([0.02, 0.04])  # two seeds: a t interval would have one degree of freedom
    Interval(mean=0.03, lo=nan, hi=nan, n=2)
    >>> e = over_seeds([0.02, 0.04, 0.03])
    >>> round(e.lo, 4), round(e.hi, 4)
    (0.0052, 0.0548)
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if 0 < x.size < MIN_SEEDS:
        return Interval(float(x.mean()), math.nan, math.nan, int(x.size))
    return _mean_interval(x, bounds)


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
    return _mean_interval(x - y, DIFFERENCES)  # nan where either is missing: dropped there


def seeds_and_prompts(differences: Sequence[Sequence[float]], bounds: tuple[float, float] = DIFFERENCES) -> Interval:
    """The mean of ``differences[s][i]`` (seed s, prompt i) with a 95% interval over both seeds
    and prompts (see the module docstring), within ``bounds`` (``RATES`` for accuracies
    themselves); ``n`` counts prompts. Prompts missing in any seed are dropped. Below
    ``MIN_SEEDS`` seeds the interval is over prompts only, of the seeds' mean per prompt
    (``scope == "prompts"``).

    >>> d = [[0.1, 0.0, 0.2, 0.1], [0.0, 0.1, 0.1, 0.2], [0.1, 0.1, 0.2, 0.0]]
    >>> e = seeds_and_prompts(d)
    >>> round(e.mean, 4), round(e.lo, 4), round(e.hi, 4), e.n, e.scope
    (0.1, 0.025, 0.175, 4, '')
    >>> e = seeds_and_prompts(d[:2])  # two seeds: their part is unresolved
    >>> round(e.mean, 4), round(e.lo, 4), round(e.hi, 4), e.scope
    (0.1, 0.0081, 0.1919, 'prompts')
    >>> one, pd = seeds_and_prompts([[0.5, 0.0, 0.25]]), paired_difference([0.5, 0.0, 0.25], [0.0, 0.0, 0.0])
    >>> (one.mean, one.lo, one.hi) == (pd.mean, pd.lo, pd.hi), one.scope
    (True, 'prompts')
    """
    d = np.asarray(differences, dtype=float)
    if d.ndim != 2 or d.size == 0:
        raise ValueError(f"differences must be seeds x prompts, got shape {d.shape}")
    d = d[:, np.isfinite(d).all(axis=0)]
    seeds, prompts = d.shape
    if seeds < MIN_SEEDS:
        return _mean_interval(d.mean(axis=0), bounds, scope="prompts")
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
    return _t_interval(mean, variance, df, prompts, bounds)
