"""Paired bootstrap intervals over prompts for ratios of sums, the same resamples for every gate.

Every gate of a replay saw the same recorded groups, so a figure of each gate per log group
(averaged over the replay orders first: the orders' spread is within a group, and a group is
the unit resampled) can be compared gate against gate on one resample of groups. A yield is a
ratio of sums (informative groups over rollouts); ``ratio_intervals`` draws ``resamples``
multinomial resamples of the groups once and evaluates every gate's ratio, and every ratio of
two gates' ratios, on each of them.

>>> num = {"a": np.array([1.0, 0.0, 1.0, 1.0]), "b": np.array([1.0, 0.0, 0.0, 1.0])}
>>> den = {"a": np.array([4.0, 4.0, 4.0, 4.0]), "b": np.array([4.0, 4.0, 4.0, 4.0])}
>>> out = ratio_intervals(num, den, reference="b", resamples=200, seed=0)
>>> round(out["a"].value, 4), round(out["b"].value, 4), round(out["a"].versus["b"][0], 2)
(0.1875, 0.125, 1.5)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

CHUNK = 100  # resamples drawn at once (a chunk is CHUNK x groups weights)


@dataclass(frozen=True)
class RatioInterval:
    """A ratio of sums, its 95% percentile interval, and its ratio to other gates' (value, lo, hi)."""

    value: float
    lo: float
    hi: float
    versus: dict[str, tuple[float, float, float]] = field(default_factory=dict)


def ratio_intervals(
    numerators: Mapping[str, np.ndarray],
    denominators: Mapping[str, np.ndarray],
    reference: str | tuple[str, ...] = (),
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, RatioInterval]:
    """Each gate's ``sum(num) / sum(den)`` with its 95% interval over resampled groups, and its
    ratio to each gate in ``reference`` (paired: the same resample)."""
    refs = (reference,) if isinstance(reference, str) else tuple(reference)
    names = list(numerators)
    n = len(next(iter(numerators.values()))) if names else 0
    if n == 0:
        return {g: RatioInterval(math.nan, math.nan, math.nan) for g in names}
    num = np.stack([np.asarray(numerators[g], dtype=float) for g in names])
    den = np.stack([np.asarray(denominators[g], dtype=float) for g in names])
    rng = np.random.default_rng(seed)
    draws = []
    left = resamples
    while left > 0:
        size = min(CHUNK, left)
        weights = rng.multinomial(n, np.full(n, 1.0 / n), size=size).astype(float)  # size x n
        with np.errstate(divide="ignore", invalid="ignore"):
            draws.append((weights @ num.T) / (weights @ den.T))  # size x gates
        left -= size
    sample = np.concatenate(draws) if draws else np.zeros((0, len(names)))
    with np.errstate(divide="ignore", invalid="ignore"):
        point = num.sum(axis=1) / den.sum(axis=1)
    out = {}
    for j, g in enumerate(names):
        lo, hi = _percentiles(sample[:, j])
        versus = {}
        for ref in refs:
            if ref in names and ref != g:
                r = names.index(ref)
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = sample[:, j] / sample[:, r]
                    value = point[j] / point[r]
                versus[ref] = (float(value), *_percentiles(ratio))
        out[g] = RatioInterval(float(point[j]), lo, hi, versus)
    return out


def _percentiles(values: np.ndarray) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if len(finite) < 2:
        return math.nan, math.nan
    lo, hi = np.percentile(finite, [2.5, 97.5])
    return float(lo), float(hi)
