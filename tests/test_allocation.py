"""controller.allocation: HORA's worked example, exhaustive optimality, ties, validation."""

from __future__ import annotations

import doctest
import itertools
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import betaln

import controller.allocation as alloc
from controller.allocation import hora_allocate, hora_posteriors, total_hit_utility
from controller.posterior import hit_utility


def compositions(total: int, parts: int):
    """Every way to write ``total`` as an ordered sum of ``parts`` non-negative ints."""
    for cuts in itertools.combinations(range(total + parts - 1), parts - 1):
        bounds = (-1,) + cuts + (total + parts - 1,)
        yield [bounds[i + 1] - bounds[i] - 1 for i in range(parts)]


def exhaustive_optimum(successes, probes, budget, prior=(1.0, 1.0)) -> float:
    posteriors = hora_posteriors(successes, probes, prior)
    return max(
        math.fsum(hit_utility(a, b, m) for (a, b), m in zip(posteriors, extra))
        for extra in compositions(budget, len(posteriors))
    )


def test_doctests_run():
    result = doctest.testmod(alloc)
    assert result.attempted >= 5 and result.failed == 0


def test_compositions_helper_is_complete():
    assert sorted(map(tuple, compositions(3, 2))) == [(0, 3), (1, 2), (2, 1), (3, 0)]
    assert sum(1 for _ in compositions(6, 4)) == math.comb(9, 3)


def test_methods_worked_example():
    successes = (0, 0, 1, 2, 2, 3, 4, 4)
    extra = hora_allocate(successes, probes=4, budget=96)
    assert sum(extra) == 96
    expected = (25, 24, 15, 9, 9, 6, 4, 4)
    # Up to tie order between equal prompts: compare the shares of each equal-count class.
    for s in set(successes):
        got = sorted(m for m, si in zip(extra, successes) if si == s)
        want = sorted(m for m, si in zip(expected, successes) if si == s)
        assert got == want, f"prompts with {s} successes got {got}, expected {want}"
    # And our tie rule (lowest index first) makes it exact.
    assert extra == list(expected)


def test_worked_example_is_optimal_against_neighbours():
    successes = (0, 0, 1, 2, 2, 3, 4, 4)
    extra = hora_allocate(successes, probes=4, budget=96)
    best = total_hit_utility(successes, 4, extra)
    # Moving one rollout between any two prompts never helps (concavity makes this sufficient).
    for i, j in itertools.permutations(range(len(extra)), 2):
        if extra[i] == 0:
            continue
        moved = list(extra)
        moved[i] -= 1
        moved[j] += 1
        assert total_hit_utility(successes, 4, moved) <= best + 1e-12


def test_marginal_gain_matches_betaln_formula():
    # The heap advances log D by one factor per rollout; check it against the defining ratio.
    a, b = 1.0 + 1, 1.0 + 3
    log_d = alloc._log_first_gain(a, b)
    for level in range(200):
        direct = betaln(a + 1, b + level) - betaln(a, b)
        assert log_d == pytest.approx(direct, rel=1e-12, abs=1e-12)
        assert math.exp(log_d) == pytest.approx(hit_utility(a, b, level + 1) - hit_utility(a, b, level), rel=1e-9)
        log_d += alloc._log_gain_step(a, b, level)


@pytest.mark.parametrize("seed", range(12))
def test_greedy_matches_exhaustive_optimum(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5))
    probes = [int(g) for g in rng.integers(0, 9, size=n)]
    successes = [int(rng.integers(0, g + 1)) for g in probes]
    budget = int(rng.integers(0, 13))
    prior = (float(rng.uniform(0.3, 3.0)), float(rng.uniform(0.3, 3.0)))
    extra = hora_allocate(successes, probes, budget, prior)
    assert sum(extra) == budget and min(extra) >= 0
    greedy = total_hit_utility(successes, probes, extra, prior)
    assert greedy == pytest.approx(exhaustive_optimum(successes, probes, budget, prior), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    batch=st.lists(
        st.integers(0, 6).flatmap(lambda g: st.tuples(st.integers(0, g), st.just(g))),
        min_size=1,
        max_size=3,
    ),
    budget=st.integers(0, 9),
)
def test_greedy_is_optimal_property(batch, budget):
    successes = [s for s, _ in batch]
    probes = [g for _, g in batch]
    extra = hora_allocate(successes, probes, budget)
    assert sum(extra) == budget
    greedy = total_hit_utility(successes, probes, extra)
    assert greedy == pytest.approx(exhaustive_optimum(successes, probes, budget), abs=1e-12)


def test_equal_prompts_differ_by_at_most_one_and_lower_index_leads():
    extra = hora_allocate([2] * 5, probes=4, budget=13)
    assert extra == [3, 3, 3, 2, 2]
    extra = hora_allocate([1, 3, 1, 3, 1], probes=4, budget=31)
    ones = [extra[0], extra[2], extra[4]]
    threes = [extra[1], extra[3]]
    assert max(ones) - min(ones) <= 1 and max(threes) - min(threes) <= 1
    assert ones == sorted(ones, reverse=True) and threes == sorted(threes, reverse=True)


def test_probes_per_prompt_and_priors():
    # A prompt probed 16 times without success is believed harder than one probed twice.
    extra = hora_allocate([0, 0], probes=[16, 2], budget=10)
    assert extra[1] > extra[0]
    # A whole-numbered prior acts as pseudo-counts: Beta(3, 2) + (s, G0) == Beta(1, 1) + (s + 2,
    # G0 + 3).
    successes, probes = [0, 1, 2, 4], [2, 4, 4, 8]
    shifted = hora_allocate([s + 2 for s in successes], [g + 3 for g in probes], budget=40)
    assert hora_allocate(successes, probes, budget=40, prior=(3.0, 2.0)) == shifted
    assert shifted != hora_allocate(successes, probes, budget=40)


def test_budget_zero_and_single_prompt():
    assert hora_allocate([1, 2, 3], probes=4, budget=0) == [0, 0, 0]
    assert hora_allocate([0], probes=4, budget=7) == [7]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(successes=[], probes=4, budget=3), "successes is empty"),
        (dict(successes=[1, 2], probes=4, budget=-1), "budget=-1 is negative"),
        (dict(successes=[1, 2], probes=4, budget=2.5), "budget=2.5 must be a whole number"),
        (dict(successes=[1, 5], probes=4, budget=3), "successes\\[1\\]=5 exceeds its probe size 4"),
        (dict(successes=[1, -1], probes=4, budget=3), "successes\\[1\\]=-1 is negative"),
        (dict(successes=[1, 2], probes=[4], budget=3), "probes has 1 entries but successes has 2"),
        (dict(successes=[1], probes=4, budget=3, prior=(0.0, 1.0)), "prior a0=0.0"),
    ],
)
def test_invalid_inputs_raise_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hora_allocate(**kwargs)


def test_total_hit_utility_validates_length():
    with pytest.raises(ValueError, match="extra has 1 entries but successes has 2"):
        total_hit_utility([0, 1], 4, [3])


def test_large_batch_is_fast_and_finite():
    rng = np.random.default_rng(7)
    probes = rng.integers(1, 1025, size=512)
    successes = [int(rng.integers(0, g + 1)) for g in probes]
    start = time.perf_counter()
    extra = hora_allocate(successes, [int(g) for g in probes], budget=50_000)
    elapsed = time.perf_counter() - start
    assert sum(extra) == 50_000 and min(extra) >= 0
    assert math.isfinite(total_hit_utility(successes, [int(g) for g in probes], extra))
    assert elapsed < 3.0, f"50k rollouts over 512 prompts took {elapsed:.2f}s"


def test_huge_counts_do_not_overflow():
    extra = hora_allocate([10**6, 0, 500_000], probes=[10**6, 10**6, 10**6], budget=1024)
    assert sum(extra) == 1024
    # Half-solved prompt (p ~ 0.5) is nearly sure to hit with one rollout; the always-solved one
    # too; the never-solved one (p ~ 1e-6) has the largest marginal value for a long time.
    assert extra[1] == max(extra)


def exhaustive_capped_optimum(successes, probes, budget, caps) -> tuple[float, int]:
    """The best utility and the most rollouts any allocation within the caps spends."""
    spend = min(budget, sum(caps))
    posteriors = hora_posteriors(successes, probes)
    best = max(
        math.fsum(hit_utility(a, b, m) for (a, b), m in zip(posteriors, extra))
        for extra in compositions(spend, len(posteriors))
        if all(m <= c for m, c in zip(extra, caps))
    )
    return best, spend


@pytest.mark.parametrize("seed", range(12))
def test_capped_greedy_matches_exhaustive_optimum(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 5))
    probes = [int(g) for g in rng.integers(1, 9, size=n)]
    successes = [int(rng.integers(0, g + 1)) for g in probes]
    caps = [int(c) for c in rng.integers(0, 6, size=n)]
    budget = int(rng.integers(0, 16))
    extra = hora_allocate(successes, probes, budget, cap=caps)
    best, spend = exhaustive_capped_optimum(successes, probes, budget, caps)
    assert all(m <= c for m, c in zip(extra, caps))
    assert sum(extra) == spend  # the budget is spent unless every prompt is at its cap
    assert total_hit_utility(successes, probes, extra) == pytest.approx(best, abs=1e-12)


def test_a_cap_as_large_as_the_budget_changes_nothing():
    successes = (0, 0, 1, 2, 2, 3, 4, 4)
    assert hora_allocate(successes, 4, 96, cap=96) == hora_allocate(successes, 4, 96)


def test_cap_count_must_match():
    with pytest.raises(ValueError, match="cap has 1 entries but successes has 2"):
        hora_allocate([0, 1], 4, 4, cap=[3])
