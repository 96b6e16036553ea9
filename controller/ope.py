"""Off-policy evaluation of a contextual-bandit policy from logged decisions (RAIL's replay).

Each logged record i holds the reward ``r_i`` of the action the behaviour (logging) policy took,
that action's logged propensity ``mu_i = mu(a_i | x_i) > 0``, and the probability the target
policy would have taken the same action, ``pi_i = pi(a_i | x_i)``. The importance weight is
``w_i = pi_i / mu_i``. Three estimates of the target policy's mean reward:

* ``ips``:  mean of ``w_i r_i``; unbiased, high variance.
* ``snips``: ``sum w_i r_i / sum w_i``; self-normalised, slightly biased (O(1/n)), far less
  variance when weights are large.
* ``doubly_robust``: mean of ``qhat_pi(x_i) + w_i (r_i - qhat(x_i, a_i))``; unbiased when
  the propensities are right, whatever the reward model ``qhat``, and lower variance the better
  ``qhat`` is. ``qhat_pi(x) = sum_a pi(a | x) qhat(x, a)``.

Confidence intervals use the normal approximation of the per-record terms (the delta method
for SNIPS). ``clip`` caps the weights at a maximum: less variance, bias toward the logging
policy's value. The same formulas evaluate costs instead of rewards, since they are linear.

>>> est = ips([1.0, 0.0, 1.0, 1.0], [0.5, 0.5, 0.25, 0.5], [1.0, 0.0, 0.5, 1.0])
>>> est.value, est.n, est.method
(1.5, 4, 'ips')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

__all__ = ["Estimate", "doubly_robust", "ips", "snips"]

ArrayLike = Sequence[float] | np.ndarray


@dataclass(frozen=True)
class Estimate:
    """An off-policy estimate of a policy's mean reward, with a normal confidence interval.

    With a single record the spread is unknown: ``stderr`` is infinite and so are the bounds.

    >>> e = Estimate(value=0.5, lower=0.4, upper=0.6, n=100, stderr=0.051, method="ips")
    >>> e.lower <= e.value <= e.upper
    True
    """

    value: float
    """Point estimate of the target policy's mean reward."""
    lower: float
    """Lower end of the two-sided confidence interval."""
    upper: float
    """Upper end of the two-sided confidence interval."""
    n: int
    """Number of logged records used."""
    stderr: float
    """Estimated standard error of ``value``."""
    method: str
    """``"ips"``, ``"snips"`` or ``"dr"``."""
    confidence: float = 0.95
    """Nominal coverage of ``[lower, upper]``."""


# -- validation ----------------------------------------------------------------------------


def _vector(name: str, values: ArrayLike) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (one entry per record), got shape {array.shape}")
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{name}[{i}]={float(array[i])!r} is not finite ({bad.size} such entries); drop or "
            f"repair those records before evaluating"
        )
    return array


def _weights(
    rewards: ArrayLike,
    logged_propensities: ArrayLike,
    target_propensities: ArrayLike,
    clip: float | None,
    confidence: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Validated rewards and (optionally clipped) importance weights."""
    if not (0.0 < confidence < 1.0):
        raise ValueError(f"confidence={confidence} must lie strictly between 0 and 1, e.g. 0.95")
    r = _vector("rewards", rewards)
    mu = _vector("logged_propensities", logged_propensities)
    pi = _vector("target_propensities", target_propensities)
    _same_length(r, logged_propensities=mu, target_propensities=pi)
    if r.size == 0:
        raise ValueError("no records to evaluate; pass at least one logged decision")
    nonpositive = np.flatnonzero(mu <= 0.0)
    if nonpositive.size:
        i = int(nonpositive[0])
        raise ValueError(
            f"logged_propensities[{i}]={float(mu[i])!r} is not positive ({nonpositive.size} such "
            f"records): importance weighting needs the logging policy to put positive "
            f"probability on every logged action; drop those records or clip their propensity "
            f"to a small floor (which biases the estimate)"
        )
    for name, p in (("logged_propensities", mu), ("target_propensities", pi)):
        outside = np.flatnonzero((p < 0.0) | (p > 1.0))
        if outside.size:
            i = int(outside[0])
            raise ValueError(
                f"{name}[{i}]={float(p[i])!r} is not a probability in [0, 1]; pass the probability "
                f"each policy gives the logged action"
            )
    w = pi / mu
    if clip is not None:
        if not (math.isfinite(clip) and clip > 0.0):
            raise ValueError(f"clip={clip} must be a positive finite maximum weight, or None")
        w = np.minimum(w, clip)
    return r, w


def _same_length(rewards: np.ndarray, **others: np.ndarray) -> None:
    for name, array in others.items():
        if array.size != rewards.size:
            raise ValueError(
                f"{name} has {array.size} entries but rewards has {rewards.size}; pass one entry per logged record"
            )


def _interval(value: float, stderr: float, n: int, method: str, confidence: float) -> Estimate:
    z = float(norm.ppf(0.5 + confidence / 2.0))
    return Estimate(
        value=value,
        lower=value - z * stderr,
        upper=value + z * stderr,
        n=n,
        stderr=stderr,
        method=method,
        confidence=confidence,
    )


def _mean_estimate(terms: np.ndarray, method: str, confidence: float) -> Estimate:
    """Estimate from i.i.d. per-record terms: their mean and its standard error."""
    n = terms.size
    stderr = float(np.std(terms, ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    return _interval(float(np.mean(terms)), stderr, n, method, confidence)


# -- estimators ----------------------------------------------------------------------------


def ips(
    rewards: ArrayLike,
    logged_propensities: ArrayLike,
    target_propensities: ArrayLike,
    *,
    confidence: float = 0.95,
    clip: float | None = None,
) -> Estimate:
    """Inverse propensity scoring: the mean of ``w_i r_i``.

    On-policy data (target = logging policy) gives back the plain mean reward:

    >>> ips([1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]).value
    0.6666666666666666
    >>> ips([1.0, 0.0], [0.5, 0.5], [1.0, 0.0], clip=1.5).value   # weight 2 clipped to 1.5
    0.75
    """
    r, w = _weights(rewards, logged_propensities, target_propensities, clip, confidence)
    return _mean_estimate(w * r, "ips", confidence)


def snips(
    rewards: ArrayLike,
    logged_propensities: ArrayLike,
    target_propensities: ArrayLike,
    *,
    confidence: float = 0.95,
    clip: float | None = None,
) -> Estimate:
    """Self-normalised IPS: ``sum w_i r_i / sum w_i``.

    Its standard error is the delta-method one,
    ``sqrt(sum w_i^2 (r_i - V)^2 * n / (n - 1)) / sum w_i``. If the target policy gives zero
    probability to every logged action the ratio is undefined and this raises.

    >>> snips([1.0, 0.0, 1.0, 1.0], [0.5, 0.5, 0.25, 0.5], [1.0, 0.0, 0.5, 1.0]).value
    1.0
    """
    r, w = _weights(rewards, logged_propensities, target_propensities, clip, confidence)
    total = float(np.sum(w))
    if total <= 0.0:
        raise ValueError(
            "every importance weight is 0: the target policy never takes a logged action, so "
            "SNIPS is undefined; log with a policy that covers the target's actions, or use ips "
            "or doubly_robust"
        )
    value = float(np.sum(w * r) / total)
    n = r.size
    if n > 1:
        stderr = float(math.sqrt(np.sum((w * (r - value)) ** 2) * n / (n - 1)) / total)
    else:
        stderr = math.inf
    return _interval(value, stderr, n, "snips", confidence)


def doubly_robust(
    rewards: ArrayLike,
    logged_propensities: ArrayLike,
    target_propensities: ArrayLike,
    predicted_logged: ArrayLike,
    predicted_target: ArrayLike,
    *,
    confidence: float = 0.95,
    clip: float | None = None,
) -> Estimate:
    """Doubly robust: the mean of ``qhat_pi(x_i) + w_i (r_i - qhat(x_i, a_i))``.

    Parameters
    ----------
    rewards, logged_propensities, target_propensities
        As for :func:`ips`.
    predicted_logged
        The reward model's prediction ``qhat(x_i, a_i)`` for the logged action.
    predicted_target
        The reward model's expected reward under the target policy,
        ``sum_a pi(a | x_i) qhat(x_i, a)``.

    Examples
    --------
    With a reward model that predicts 0 everywhere, DR is IPS:

    >>> r, mu, pi = [1.0, 0.0, 1.0], [0.5, 0.5, 0.25], [1.0, 0.0, 0.5]
    >>> doubly_robust(r, mu, pi, [0.0] * 3, [0.0] * 3).value == ips(r, mu, pi).value
    True
    """
    r, w = _weights(rewards, logged_propensities, target_propensities, clip, confidence)
    q_logged = _vector("predicted_logged", predicted_logged)
    q_target = _vector("predicted_target", predicted_target)
    _same_length(r, predicted_logged=q_logged, predicted_target=q_target)
    return _mean_estimate(q_target + w * (r - q_logged), "dr", confidence)
