"""controller.posterior: closed forms, simulation, extremes, validation and properties."""

from __future__ import annotations

import doctest
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

import controller.posterior as post
from controller.posterior import (
    all_success_probability,
    discount_posterior,
    effective_probability,
    hit_utility,
    miss_probability,
    posterior,
    sara_expected_rollouts,
    sara_false_abandonment,
)

beta_params = st.floats(min_value=0.05, max_value=200.0, allow_nan=False)
small_counts = st.integers(min_value=0, max_value=40)


def exact_miss(a: int | Fraction, b: int | Fraction, m: int) -> Fraction:
    """B(a, b + m) / B(a, b) for rational a, b as an exact rational: prod (b + j) / (a + b + j)."""
    a, b = Fraction(a), Fraction(b)
    out = Fraction(1)
    for j in range(m):
        out *= (b + j) / (a + b + j)
    return out


def test_doctests_run():
    result = doctest.testmod(post)
    assert result.attempted > 10 and result.failed == 0


# -- closed forms --------------------------------------------------------------------------


@pytest.mark.parametrize("b,m", [(1, 1), (1, 7), (5, 3), (9, 1024)])
def test_hit_utility_uniform_closed_form(b, m):
    # a = 1: B(1, b + m) / B(1, b) = b / (b + m)
    assert hit_utility(1.0, b, m) == pytest.approx(m / (b + m), rel=1e-14)


@pytest.mark.parametrize("a,b,m", [(1, 1, 1), (2, 3, 4), (7, 1, 10), (3, 30, 64), (40, 2, 100)])
def test_moments_match_exact_rationals(a, b, m):
    miss = exact_miss(a, b, m)
    assert miss_probability(a, b, m) == pytest.approx(float(miss), rel=1e-13)
    assert hit_utility(a, b, m) == pytest.approx(float(1 - miss), rel=1e-13)
    assert all_success_probability(a, b, m) == pytest.approx(float(exact_miss(b, a, m)), rel=1e-13)


def test_large_whole_m_beyond_product_form():
    # m > 4096 takes the betaln path; the exact ratio telescopes for whole parameters.
    m = 6000
    assert miss_probability(2, 3, m) == pytest.approx(float(exact_miss(2, 3, m)), rel=1e-10)
    assert all_success_probability(2, 3, m) == pytest.approx(24 / (6002 * 6003 * 6004), rel=1e-10)


@pytest.mark.parametrize("a,b,m", [(0.5, 2.5, 3.5), (1.5, 0.7, 0.25), (3.0, 4.0, 12.75)])
def test_moments_match_numerical_integration(a, b, m):
    # Fractional m takes the betaln path: check it by quadrature.
    density = stats.beta(a, b).pdf
    miss, _ = integrate.quad(lambda p: (1 - p) ** m * density(p), 0, 1, limit=200)
    every, _ = integrate.quad(lambda p: p**m * density(p), 0, 1, limit=200)
    assert miss_probability(a, b, m) == pytest.approx(miss, rel=1e-7, abs=1e-12)
    assert all_success_probability(a, b, m) == pytest.approx(every, rel=1e-7, abs=1e-12)


def test_zero_rollouts():
    assert hit_utility(2.0, 3.0, 0) == 0.0
    assert miss_probability(2.0, 3.0, 0) == 1.0
    assert all_success_probability(2.0, 3.0, 0) == 1.0


@pytest.mark.parametrize("k,group", [(4, 8), (1, 2), (4, 16), (8, 64), (16, 1024)])
def test_effective_probability_all_same_probe_closed_form(k, group):
    m = group - k
    expected = m / (k + m + 1)
    assert effective_probability(k, 0, group) == pytest.approx(expected, rel=1e-13)
    assert effective_probability(0, k, group) == pytest.approx(expected, rel=1e-13)


def test_effective_probability_paper_example():
    assert effective_probability(4, 0, 8) == pytest.approx(4 / 9, abs=1e-15)


def test_effective_probability_cases():
    assert effective_probability(1, 1, 8) == 1.0
    assert effective_probability(3, 5, 8) == 1.0  # mixed and complete
    assert effective_probability(8, 0, 8) == 0.0
    assert effective_probability(0, 8, 8) == 0.0
    assert effective_probability(0, 0, 0) == 0.0
    assert effective_probability(0, 0, 1) == pytest.approx(0.0, abs=1e-15)
    # Nothing seen, uniform prior: P(mixed of G) = 1 - 2 / (G + 1).
    for size in (2, 3, 8, 100):
        assert effective_probability(0, 0, size) == pytest.approx(1 - 2 / (size + 1), rel=1e-13)


def test_effective_probability_with_prior():
    # Prior Beta(2, 5), 3 successes seen, G = 6: P(a failure among 3) = 1 - B(8, 5)/B(5, 5).
    expected = 1 - float(exact_miss(5, 5, 3))
    assert effective_probability(3, 0, 6, prior=(2.0, 5.0)) == pytest.approx(expected, rel=1e-13)


def test_posterior_and_discount():
    assert posterior(3, 5) == (4.0, 6.0)
    assert posterior(0, 0, prior=(0.5, 2.0)) == (0.5, 2.0)
    assert discount_posterior(11.0, 5.0, 1.0) == (11.0, 5.0)
    assert discount_posterior(11.0, 5.0, 0.0, prior=(2.0, 3.0)) == (2.0, 3.0)
    a, b = discount_posterior(11.0, 5.0, 0.25)
    assert (a, b) == (3.5, 2.0)
    # Carrying twice at gamma equals carrying once at gamma**2.
    twice = discount_posterior(*discount_posterior(11.0, 5.0, 0.5), 0.5)
    assert twice == pytest.approx(discount_posterior(11.0, 5.0, 0.25))


# -- Monte-Carlo checks against a simulated Beta-Binomial ----------------------------------


@pytest.mark.parametrize(
    "successes,failures,group,prior",
    [
        (4, 0, 8, (1.0, 1.0)),
        (0, 4, 8, (1.0, 1.0)),
        (2, 0, 6, (2.0, 5.0)),
        (0, 3, 10, (0.5, 0.5)),
        (0, 0, 4, (1.5, 3.0)),
        (1, 2, 8, (1.0, 1.0)),
    ],
)
def test_effective_probability_matches_simulation(successes, failures, group, prior):
    rng = np.random.default_rng(1234 + 17 * successes + failures + group)
    n = 200_000
    p = rng.beta(*prior, size=n)
    outcomes = rng.random((n, group)) < p[:, None]
    seen = successes + failures
    # Rollouts are exchangeable given p, so conditioning on the counts of the first `seen`
    # outcomes is conditioning on what the gate has observed.
    matches = outcomes[:, :seen].sum(axis=1) == successes
    final = outcomes[matches].sum(axis=1)
    mixed = (final > 0) & (final < group)
    estimate = mixed.mean()
    se = math.sqrt(max(estimate * (1 - estimate), 1e-4) / mixed.size)
    assert mixed.size > 5_000
    assert abs(estimate - effective_probability(successes, failures, group, prior)) < 4.5 * se


@pytest.mark.parametrize("p,k,group", [(0.5, 4, 8), (0.1, 4, 8), (0.9, 2, 16), (0.03, 8, 8)])
def test_sara_closed_forms_match_simulation(p, k, group):
    rng = np.random.default_rng(99)
    n = 200_000
    outcomes = rng.random((n, group)) < p
    probe = outcomes[:, :k].sum(axis=1)
    abandoned = (probe == 0) | (probe == k)
    rollouts = np.where(abandoned, k, group)
    total = outcomes.sum(axis=1)
    falsely = abandoned & (total > 0) & (total < group)
    se_roll = rollouts.std() / math.sqrt(n)
    assert abs(rollouts.mean() - sara_expected_rollouts(p, k, group)) < 4.5 * se_roll + 1e-12
    fa = falsely.mean()
    se_fa = math.sqrt(max(fa * (1 - fa), 1e-6) / n)
    assert abs(fa - sara_false_abandonment(p, k, group)) < 4.5 * se_fa


@pytest.mark.parametrize("prior,k,group", [((1.0, 1.0), 4, 8), ((0.5, 2.0), 4, 16), ((3.0, 1.0), 2, 8)])
def test_sara_closed_forms_agree_with_posterior_predictor(prior, k, group):
    # Averaged over p ~ prior, "abandoned yet mixed-to-be" is P(all-same probe) x P_eff.
    density = stats.beta(*prior).pdf
    mean_fa, _ = integrate.quad(lambda p: sara_false_abandonment(p, k, group) * density(p), 0, 1)
    a0, b0 = prior
    expected = all_success_probability(a0, b0, k) * effective_probability(k, 0, group, prior) + (
        miss_probability(a0, b0, k) * effective_probability(0, k, group, prior)
    )
    assert mean_fa == pytest.approx(expected, rel=1e-7)
    mean_roll, _ = integrate.quad(lambda p: sara_expected_rollouts(p, k, group) * density(p), 0, 1)
    same = all_success_probability(a0, b0, k) + miss_probability(a0, b0, k)
    assert mean_roll == pytest.approx(k + (group - k) * (1 - same), rel=1e-7)


def test_sara_paper_uniform_case():
    # Under a uniform pool of p, false abandonment at G=8, k=4 is 2 * 4 / (5 * 9).
    value, _ = integrate.quad(lambda p: sara_false_abandonment(p, 4, 8), 0, 1)
    assert value == pytest.approx(8 / 45, rel=1e-9)
    assert sara_expected_rollouts(0.0, 4, 8) == 4.0
    assert sara_false_abandonment(0.0, 4, 8) == 0.0


# -- extremes ------------------------------------------------------------------------------


@pytest.mark.parametrize("a", [0.5, 1.0, 1e3, 1e6 + 1])
@pytest.mark.parametrize("b", [0.5, 1.0, 1e3, 1e6 + 1])
@pytest.mark.parametrize("m", [1, 1024, 10**6])
def test_extremes_are_finite_and_bounded(a, b, m):
    values = (hit_utility(a, b, m), miss_probability(a, b, m), all_success_probability(a, b, m))
    for value in values:
        assert math.isfinite(value) and 0.0 <= value <= 1.0
    assert hit_utility(a, b, m) + miss_probability(a, b, m) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("successes,failures", [(10**6, 0), (0, 10**6), (1000, 0), (0, 0), (10**6, 3)])
def test_effective_probability_huge_counts(successes, failures):
    group = successes + failures + 1024
    value = effective_probability(successes, failures, group)
    assert math.isfinite(value) and 0.0 <= value <= 1.0
    if failures == 0 and successes > 0:
        k, m = successes, 1024
        assert value == pytest.approx(m / (k + m + 1), rel=1e-11)


def test_tiny_utilities_keep_relative_precision():
    # a = 1, b = 1e6: U(1) = 1 / (1e6 + 1); a plain betaln difference is off by ~2e-7 here.
    assert hit_utility(1.0, 1e6, 1) == pytest.approx(1 / (1e6 + 1), rel=1e-12)
    exact = 1 - exact_miss(Fraction(1, 2), 10**6, 8)
    assert hit_utility(0.5, 1e6, 8) == pytest.approx(float(exact), rel=1e-11)
    exact = 1 - exact_miss(3, 10**6, 1024)
    assert hit_utility(3.0, 1e6, 1024) == pytest.approx(float(exact), rel=1e-11)


# -- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: hit_utility(-1.0, 1.0, 3), "a=-1.0 must be a positive"),
        (lambda: hit_utility(1.0, 0.0, 3), "b=0.0 must be a positive"),
        (lambda: hit_utility(1.0, float("nan"), 3), "b=nan"),
        (lambda: hit_utility(1.0, 1.0, -1), "m=-1.0 must be a finite number of rollouts >= 0"),
        (lambda: miss_probability(1.0, 1.0, float("inf")), "m=inf"),
        (lambda: effective_probability(4, 5, 8), "successes \\+ failures = 9 exceeds group_size=8"),
        (lambda: effective_probability(-1, 0, 8), "successes=-1 is negative"),
        (lambda: effective_probability(1.5, 0, 8), "successes=1.5 must be a whole number"),
        (lambda: effective_probability(1, 0, 8, prior=(-1.0, 1.0)), "prior a0=-1.0"),
        (lambda: effective_probability(1, 0, 8, prior=(1.0,)), "must be a pair"),
        (lambda: posterior(-2, 0), "successes=-2.0"),
        (lambda: discount_posterior(2.0, 2.0, 1.5), "gamma=1.5 must lie in \\[0, 1\\]"),
        (lambda: sara_expected_rollouts(1.2, 4, 8), "p=1.2 must be a probability"),
        (lambda: sara_false_abandonment(0.5, 4, 3), "group_size=3 is below probe_size=4"),
        (lambda: sara_false_abandonment(0.5, 0, 3), "probe_size=0 must be at least 1"),
    ],
)
def test_invalid_inputs_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_counts_accept_numpy_and_integral_floats():
    assert effective_probability(np.int64(4), 0.0, np.int32(8)) == pytest.approx(4 / 9)


# -- properties ----------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(a=beta_params, b=beta_params, m=st.integers(min_value=0, max_value=300))
def test_hit_utility_properties(a, b, m):
    u, u_next = hit_utility(a, b, m), hit_utility(a, b, m + 1)
    assert 0.0 <= u <= u_next <= 1.0
    # Increments (HORA's marginal gains) never grow: U is concave in m.
    assert u_next - u >= hit_utility(a, b, m + 2) - u_next - 1e-12
    assert u + miss_probability(a, b, m) == pytest.approx(1.0, abs=1e-12)
    assert all_success_probability(a, b, m) == pytest.approx(miss_probability(b, a, m), rel=1e-12)


@settings(max_examples=150, deadline=None)
@given(s=small_counts, f=small_counts, extra=small_counts, a0=beta_params, b0=beta_params)
def test_effective_probability_properties(s, f, extra, a0, b0):
    group = s + f + extra
    value = effective_probability(s, f, group, prior=(a0, b0))
    assert 0.0 <= value <= 1.0
    # Success and failure play mirror roles.
    assert value == pytest.approx(effective_probability(f, s, group, prior=(b0, a0)), abs=1e-12)
    # More rollouts left can only help a saturated-so-far group become mixed.
    if not (s > 0 and f > 0):
        assert effective_probability(s, f, group + 1, prior=(a0, b0)) >= value - 1e-12


@settings(max_examples=100, deadline=None)
@given(a=beta_params, b=beta_params, gamma=st.floats(0.0, 1.0), a0=beta_params, b0=beta_params)
def test_discount_posterior_stays_between_prior_and_posterior(a, b, gamma, a0, b0):
    da, db = discount_posterior(a, b, gamma, prior=(a0, b0))
    assert min(a, a0) - 1e-9 <= da <= max(a, a0) + 1e-9
    assert min(b, b0) - 1e-9 <= db <= max(b, b0) + 1e-9
    assert da > 0 and db > 0
