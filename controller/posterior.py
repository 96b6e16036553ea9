"""Beta-Binomial math behind the gates: posteriors, hit utility, group-effectiveness odds.

A prompt's success probability ``p`` under the current policy gets a Beta(a, b) posterior from
the binary rewards seen so far (``a = a0 + successes``, ``b = b0 + failures``). Everything a gate
needs follows from two moments of that posterior,

* ``E[(1 - p)^m] = B(a, b + m) / B(a, b)``: m more rollouts all fail, and
* ``E[p^m]       = B(a + m, b) / B(a, b)``: m more rollouts all succeed,

evaluated in log space so that nothing overflows or underflows for counts up to 1e6 and groups
of 1024 (the Beta function itself underflows long before that): as a sum of logs of the
product form for whole m up to 4096, which keeps ~1e-12 relative precision even for huge counts,
and as a difference of ``scipy.special.betaln`` values beyond that.

* HORA (docs/methods.md, HORA) ranks prompts by the hit utility ``1 - E[(1 - p)^m]``.
* SARA (docs/methods.md, SARA) abandons a partial group when the chance that the finished group holds both
  a success and a failure, ``effective_probability``, is low; ``sara_expected_rollouts`` and
  ``sara_false_abandonment`` are the closed forms of "abandon iff the k-probe is all-same".

>>> round(hit_utility(1.0, 5.0, 3), 6)             # uniform prior, 4 failures seen: 3/8
0.375
>>> round(effective_probability(4, 0, group_size=8), 6)   # all-correct probe of 4: 4/9
0.444444
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from scipy.special import betaln

__all__ = [
    "all_success_probability",
    "discount_posterior",
    "effective_probability",
    "hit_utility",
    "miss_probability",
    "posterior",
    "sara_expected_rollouts",
    "sara_false_abandonment",
]

UNIFORM_PRIOR = (1.0, 1.0)


# -- validation ----------------------------------------------------------------------------


def _beta_parameter(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(
            f"{name}={value!r} must be a positive finite Beta parameter; a posterior is the prior "
            f"plus counts (e.g. a = 1 + successes), and the prior needs a0 > 0 and b0 > 0"
        )
    return value


def _prior(prior: tuple[float, float]) -> tuple[float, float]:
    try:
        a0, b0 = prior
    except (TypeError, ValueError):
        raise ValueError(f"prior={prior!r} must be a pair (a0, b0) of Beta pseudo-counts, e.g. (1.0, 1.0)") from None
    return _beta_parameter("prior a0", a0), _beta_parameter("prior b0", b0)


def _rollouts(name: str, value: float) -> float:
    """A number of future rollouts; the formulas hold for any real m >= 0."""
    value = float(value)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{name}={value!r} must be a finite number of rollouts >= 0")
    return value


def _count(name: str, value: int) -> int:
    """A non-negative whole number; accepts ints, numpy integers and integral floats."""
    if type(value) is int:  # the gates' own counts: no trip through the ABCs' instance checks
        count = value
    elif isinstance(value, numbers.Integral):
        count = int(value)
    elif isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        count = int(value)
    else:
        raise ValueError(f"{name}={value} must be a whole number of rollouts")
    if count < 0:
        raise ValueError(f"{name}={count} is negative; counts of rollouts are >= 0")
    return count


def _probability(name: str, value: float) -> float:
    value = float(value)
    if not (0.0 <= value <= 1.0):
        raise ValueError(f"{name}={value!r} must be a probability in [0, 1]")
    return value


# -- posterior -----------------------------------------------------------------------------


def posterior(successes: float, failures: float, prior: tuple[float, float] = UNIFORM_PRIOR) -> tuple[float, float]:
    """Beta posterior ``(a0 + successes, b0 + failures)`` of a prompt's success probability.

    Counts may be fractional (down-weighted or discounted observations) but not negative.

    >>> posterior(3, 1)
    (4.0, 2.0)
    >>> posterior(0, 4, prior=(0.5, 0.5))
    (0.5, 4.5)
    """
    a0, b0 = _prior(prior)
    s = _rollouts("successes", successes)
    f = _rollouts("failures", failures)
    return a0 + s, b0 + f


def discount_posterior(
    a: float, b: float, gamma: float, prior: tuple[float, float] = UNIFORM_PRIOR
) -> tuple[float, float]:
    """Shrink a posterior toward ``prior`` by ``gamma``: ``a0 + gamma * (a - a0)``, same for b.

    Used to carry a prompt's posterior into a later epoch while the policy moves: ``gamma = 1``
    keeps it, ``gamma = 0`` forgets it, and after n carries an old observation weighs
    ``gamma**n``. The result is a convex combination of two valid Beta parameters, so it is
    always valid.

    >>> discount_posterior(9.0, 3.0, gamma=0.5)
    (5.0, 2.0)
    >>> discount_posterior(9.0, 3.0, gamma=0.0)
    (1.0, 1.0)
    """
    a = _beta_parameter("a", a)
    b = _beta_parameter("b", b)
    a0, b0 = _prior(prior)
    gamma = float(gamma)
    if not (0.0 <= gamma <= 1.0):
        raise ValueError(f"gamma={gamma!r} must lie in [0, 1]; 1 keeps the carried posterior, 0 resets it")
    return a0 + gamma * (a - a0), b0 + gamma * (b - b0)


# -- Beta-Binomial moments -----------------------------------------------------------------


# Whole numbers of rollouts up to this many use the exact product form below; larger or
# fractional m fall back to a difference of betaln values.
_PRODUCT_FORM_LIMIT = 4096


def _log_miss(a: float, b: float, m: float) -> float:
    """log E[(1 - p)^m] = log B(a, b + m) - log B(a, b) under Beta(a, b); always <= 0.

    For whole m the ratio is the product over j < m of (b + j) / (a + b + j). Summing the logs
    of those factors keeps full relative precision where the betaln difference cancels: with
    b = 1e6 the two betaln values agree to ~13 digits and their difference keeps ~1e-9 absolute
    error, which is a 0.2% error on a hit utility of 5e-7 (a = 0.5). Each factor's log is taken with
    ``log1p`` when it is close to 1 and with ``log`` otherwise, so neither branch cancels.
    """
    if m <= _PRODUCT_FORM_LIMIT and float(m).is_integer():
        if m <= 64:  # a plain loop beats numpy's call overhead for typical group sizes
            total_log = 0.0
            for j in range(int(m)):
                total = a + b + j
                factor = (b + j) / total
                total_log += math.log1p(-a / total) if factor > 0.5 else math.log(factor)
            return total_log
        js = np.arange(int(m), dtype=np.float64)
        totals = a + b + js
        factors = (b + js) / totals
        logs = np.where(factors > 0.5, np.log1p(-a / totals), np.log(factors))
        return float(logs.sum())
    return min(0.0, float(betaln(a, b + m) - betaln(a, b)))


def _log_all_success(a: float, b: float, m: float) -> float:
    """log E[p^m] under Beta(a, b): the mirror image of ``_log_miss``."""
    return _log_miss(b, a, m)


def miss_probability(a: float, b: float, m: float) -> float:
    """P(all of m more rollouts fail) under Beta(a, b): ``B(a, b + m) / B(a, b)``.

    >>> round(miss_probability(1.0, 1.0, 3), 12)    # uniform prior: 1 / (m + 1)
    0.25
    >>> miss_probability(2.0, 2.0, 0)
    1.0
    """
    a, b = _beta_parameter("a", a), _beta_parameter("b", b)
    m = _rollouts("m", m)
    return math.exp(_log_miss(a, b, m))


def all_success_probability(a: float, b: float, m: float) -> float:
    """P(all of m more rollouts succeed) under Beta(a, b): ``B(a + m, b) / B(a, b)``.

    The mirror image of :func:`miss_probability`: ``all_success_probability(a, b, m) ==
    miss_probability(b, a, m)``.

    >>> round(all_success_probability(5.0, 1.0, 4), 6)    # 5 / 9
    0.555556
    """
    a, b = _beta_parameter("a", a), _beta_parameter("b", b)
    m = _rollouts("m", m)
    return math.exp(_log_all_success(a, b, m))


def hit_utility(a: float, b: float, m: float) -> float:
    """HORA's utility: P(at least one success among m more rollouts) under Beta(a, b).

    ``1 - B(a, b + m) / B(a, b)``, computed as ``-expm1`` of a log ratio so that tiny utilities
    keep their precision. ``m = 0`` gives 0; the utility grows with m toward 1 with
    non-increasing increments (see ``controller.allocation``).

    >>> hit_utility(1.0, 1.0, 1)
    0.5
    >>> hit_utility(3.0, 2.0, 0)
    0.0
    >>> hit_utility(1e6, 1e6, 1024) > 0.999999
    True
    """
    a, b = _beta_parameter("a", a), _beta_parameter("b", b)
    m = _rollouts("m", m)
    if m == 0.0:
        return 0.0
    return min(1.0, -math.expm1(_log_miss(a, b, m)))


# -- SARA ----------------------------------------------------------------------------------


def effective_probability(
    successes: int,
    failures: int,
    group_size: int,
    prior: tuple[float, float] = UNIFORM_PRIOR,
) -> float:
    """SARA's predictor: P(the finished group of ``group_size`` holds a success and a failure).

    With ``(a, b) = prior + (successes, failures)`` and ``m = group_size - successes - failures``
    rollouts left:

    * already mixed -> 1;
    * all successes so far -> ``1 - B(a + m, b) / B(a, b)`` (some later rollout fails);
    * all failures so far -> ``1 - B(a, b + m) / B(a, b)`` (some later rollout succeeds);
    * nothing seen yet -> ``1 - P(all m succeed) - P(all m fail)``;
    * nothing left (m = 0) and not mixed -> 0.

    With the uniform prior and an all-same probe of k this is ``m / (k + m + 1)``.

    >>> round(effective_probability(4, 0, group_size=8), 6)
    0.444444
    >>> round(effective_probability(0, 4, group_size=8), 6)
    0.444444
    >>> effective_probability(1, 3, group_size=8)
    1.0
    >>> effective_probability(4, 0, group_size=4)
    0.0
    >>> round(effective_probability(0, 0, group_size=2), 6)   # 2 E[p(1 - p)] = 1/3
    0.333333
    """
    s = _count("successes", successes)
    f = _count("failures", failures)
    size = _count("group_size", group_size)
    if s + f > size:
        raise ValueError(
            f"successes + failures = {s + f} exceeds group_size={size}; a group cannot hold "
            f"more finished rollouts than its size; raise group_size or pass the group's counts"
        )
    a, b = posterior(s, f, prior)
    left = size - s - f
    if s > 0 and f > 0:
        return 1.0
    if left == 0:
        return 0.0
    if s > 0:
        return -math.expm1(_log_all_success(a, b, left))
    if f > 0:
        return -math.expm1(_log_miss(a, b, left))
    saturated = math.exp(_log_all_success(a, b, left)) + math.exp(_log_miss(a, b, left))
    return min(1.0, max(0.0, 1.0 - saturated))


def mixed_bound(logprob_sum: float, remaining: int) -> float:
    """An upper bound on P(a group whose finished rollouts all agree turns out mixed), from one
    of them alone: the policy writes that response again, and so earns its reward again, with
    probability at least ``q = exp(logprob_sum)`` per fresh rollout, so all ``remaining`` rollouts
    agree with probability at least ``q ** remaining``. No prior and no assumption about the
    prompt; exact only if the rollouts are sampled from the distribution whose log-probs are
    summed (here the policy at temperature 1, top_p 1). nan (no log-probs) gives 1.

    >>> round(mixed_bound(math.log(0.99), 7), 4)   # a response the policy writes 99% of the time
    0.0679
    >>> mixed_bound(math.log(0.5), 7) > 0.99
    True
    >>> mixed_bound(-0.1, 0)
    0.0
    """
    if remaining < 0:
        raise ValueError(f"remaining={remaining} must be >= 0")
    if math.isnan(logprob_sum):
        return 1.0
    if logprob_sum > 0:
        raise ValueError(f"logprob_sum={logprob_sum} must be <= 0: it is the log of a probability")
    return -math.expm1(remaining * logprob_sum)


def _sara_arguments(p: float, probe_size: int, group_size: int) -> tuple[float, int, int]:
    p = _probability("p", p)
    k = _count("probe_size", probe_size)
    size = _count("group_size", group_size)
    if k < 1:
        raise ValueError(f"probe_size={k} must be at least 1; the rule needs a probe to judge")
    if size < k:
        raise ValueError(f"group_size={size} is below probe_size={k}; raise group_size or lower probe_size")
    return p, k, size


def sara_expected_rollouts(p: float, probe_size: int, group_size: int) -> float:
    """Expected rollouts per prompt of "abandon iff the k-probe is all-same", true rate p.

    ``k + (G - k) (1 - p^k - (1 - p)^k)``: the probe always runs; the rest only for a mixed
    probe.

    >>> sara_expected_rollouts(0.5, 4, 8)
    7.5
    >>> sara_expected_rollouts(1.0, 4, 8)
    4.0
    """
    p, k, size = _sara_arguments(p, probe_size, group_size)
    mixed_probe = 1.0 - p**k - (1.0 - p) ** k
    return k + (size - k) * mixed_probe


def sara_false_abandonment(p: float, probe_size: int, group_size: int) -> float:
    """P(the k-probe is all-same, so the group is abandoned, yet the full group would be mixed).

    ``p^k (1 - p^(G-k)) + (1 - p)^k (1 - (1 - p)^(G-k))``, a joint probability per prompt.

    >>> round(sara_false_abandonment(0.5, 4, 8), 6)    # 2 * (1/16) * (15/16)
    0.117188
    >>> sara_false_abandonment(0.3, 4, 4)
    0.0
    """
    p, k, size = _sara_arguments(p, probe_size, group_size)
    rest = size - k
    q = 1.0 - p
    return p**k * (1.0 - p**rest) + q**k * (1.0 - q**rest)
