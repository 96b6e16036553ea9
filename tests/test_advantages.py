"""Advantage estimators on variable-size groups, against hand computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.advantages import (
    compute_advantages,
    drgrpo_advantages,
    grpo_advantages,
    rloo_advantages,
    saturated_mask,
)
from pipeline.types import CommittedGroup, FinishReason, Rollout

GROUPS = [
    (1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0),  # G = 8, binary
    (0.0, 1.0, 0.0),  # G = 3
    (0.25, 0.75),  # G = 2, non-binary
    (0.1, 0.1, 0.1, 0.1, 0.1),  # saturated, at a value whose mean is not exact in floats
    (1.0,),  # G = 1
    (0.3, -1.2, 2.5, 0.0, 0.7, 0.7),  # arbitrary real rewards
]


def _by_hand_grpo(rewards, eps, ddof):
    r = np.asarray(rewards)
    if len(r) < 2 or r.max() == r.min():
        return np.zeros(len(r))
    return (r - r.mean()) / (r.std(ddof=ddof) + eps)


@pytest.mark.parametrize("ddof", [0, 1])
def test_grpo_matches_hand_computation_on_variable_size_groups(ddof):
    got = grpo_advantages(GROUPS, eps=1e-6, ddof=ddof)
    assert [len(a) for a in got] == [len(g) for g in GROUPS]
    for adv, rewards in zip(got, GROUPS):
        np.testing.assert_allclose(adv, _by_hand_grpo(rewards, 1e-6, ddof), rtol=1e-12, atol=1e-12)


def test_grpo_two_rollouts_one_success_has_unit_advantages_with_population_std():
    (adv,) = grpo_advantages([(1.0, 0.0)], eps=0.0, ddof=0)
    assert adv == (1.0, -1.0)


def test_drgrpo_is_reward_minus_group_mean():
    got = drgrpo_advantages(GROUPS)
    for adv, rewards in zip(got, GROUPS):
        r = np.asarray(rewards)
        expected = np.zeros(len(r)) if r.max() == r.min() else r - r.mean()
        np.testing.assert_allclose(adv, expected, atol=1e-12)


def test_rloo_baseline_is_the_mean_of_the_other_rollouts():
    got = rloo_advantages(GROUPS)
    for adv, rewards in zip(got, GROUPS):
        n = len(rewards)
        for j, a in enumerate(adv):
            if n == 1 or max(rewards) == min(rewards):
                assert a == 0.0
            else:
                others = [r for i, r in enumerate(rewards) if i != j]
                assert a == pytest.approx(rewards[j] - sum(others) / (n - 1), abs=1e-12)


def test_rloo_is_drgrpo_scaled_by_n_over_n_minus_1():
    for rloo, dr, rewards in zip(rloo_advantages(GROUPS), drgrpo_advantages(GROUPS), GROUPS):
        n = len(rewards)
        if n > 1:
            np.testing.assert_allclose(rloo, np.asarray(dr) * n / (n - 1), atol=1e-12)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_saturated_and_singleton_groups_get_exact_zeros(name):
    adv = compute_advantages(GROUPS, name)
    assert adv[3] == (0.0,) * 5  # exact zeros, not a rounding residue over eps
    assert adv[4] == (0.0,)
    assert all(math.isfinite(a) for group in adv for a in group)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_advantages_sum_to_zero_within_each_group(name):
    for adv in compute_advantages(GROUPS, name):
        assert sum(adv) == pytest.approx(0.0, abs=1e-9)


def test_saturated_mask_flags_groups_without_reward_spread():
    assert saturated_mask(GROUPS) == (False, False, False, True, True, False)
    assert saturated_mask([(0.0, 0.0, 0.0), (1.0, 1.0)]) == (True, True)


def test_committed_groups_are_accepted_like_reward_tuples():
    def group(gid, rewards):
        rollouts = tuple(
            Rollout(f"g{gid}.s{i}", i, (1,), (3,), (-1.0,), r, FinishReason.STOP, 0) for i, r in enumerate(rewards)
        )
        return CommittedGroup(gid, gid, rollouts, launched=len(rewards), tokens=len(rewards))

    committed = [group(i, g) for i, g in enumerate(GROUPS)]
    assert grpo_advantages(committed) == grpo_advantages(GROUPS)
    assert saturated_mask(committed) == saturated_mask(GROUPS)


def test_non_finite_reward_and_unknown_estimator_are_clear_errors():
    with pytest.raises(ValueError, match="reward nan is not finite"):
        grpo_advantages([(1.0, float("nan"))])
    with pytest.raises(ValueError, match="algorithm='ppo' is not one of"):
        compute_advantages(GROUPS, "ppo")
