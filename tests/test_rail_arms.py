"""RAIL arms: names, costs, and the GroupActions they build."""

from __future__ import annotations

import pytest

from controller.rail.arms import NOOP, Arm, build_arms, expected_tokens, parse_arm
from controller.rail.config import RailConfig
from pipeline.config.build import ConfigError, build
from pipeline.types import ActionKind, BranchSpec, SamplingParams

DEFAULT = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=128, seed=5)


def test_default_arm_set_is_noop_six_branches_four_resamples():
    arms = build_arms(RailConfig())
    names = [a.name for a in arms]
    assert names[0] == "noop"
    assert names[1:7] == [f"branch_b{b}_t{t}" for b in (2, 4) for t in ("0.7", "1", "1.3")]
    assert names[7:] == [f"resample_n{n}_t{t}" for n in (2, 4) for t in ("1", "1.3")]
    assert len(set(names)) == len(names)


def test_duplicate_config_values_give_one_arm_each():
    arms = build_arms(RailConfig(branch_sizes=(2, 2), branch_temperatures=(1.0,), resample_sizes=()))
    assert [a.name for a in arms] == ["noop", "branch_b2_t1"]


def test_branch_arm_builds_one_launch_with_prefix_temperature_and_origin():
    spec = BranchSpec("g3-s1", 3, (11, 12, 13), (-0.1, -0.2, -0.3))
    [action] = Arm("branch", 4, 1.3).actions(group_id=3, decision_id=42, default=DEFAULT, branch=spec)
    assert action.kind is ActionKind.LAUNCH and action.group_id == 3 and action.n == 4
    assert action.params.temperature == 1.3
    assert action.params.max_tokens == 128 and action.params.top_p == 0.9  # from the run's defaults
    assert action.branch == spec
    assert action.origin == 42


def test_resample_arm_launches_fresh_samples_without_branch():
    spec = BranchSpec("g3-s1", 1, (11,), (-0.1,))
    [action] = Arm("resample", 2, 0.7).actions(group_id=9, decision_id=1, default=DEFAULT, branch=spec)
    assert action.branch is None and action.n == 2 and action.params.temperature == 0.7 and action.origin == 1


def test_noop_builds_nothing_and_branch_needs_a_prefix():
    assert NOOP.actions(group_id=1, decision_id=0, default=DEFAULT) == []
    with pytest.raises(ValueError, match="needs a BranchSpec"):
        Arm("branch", 2, 1.0).actions(group_id=1, decision_id=0, default=DEFAULT)


@pytest.mark.parametrize("arm", list(build_arms(RailConfig())) + [Arm("branch", 3, 1e-05)])
def test_names_parse_back_to_the_same_arm(arm):
    assert parse_arm(arm.name) == arm


@pytest.mark.parametrize("name", ["", "branch", "branch_b0_t1", "resample_n2", "nop", "branch_b2_tx"])
def test_foreign_arm_names_are_rejected_clearly(name):
    with pytest.raises(ValueError):
        parse_arm(name)


def test_bad_arms_are_rejected():
    with pytest.raises(ValueError, match="at least one sample"):
        Arm("branch", 0, 1.0)
    with pytest.raises(ValueError, match="temperature"):
        Arm("resample", 2, 0.0)
    with pytest.raises(ValueError, match="kind"):
        Arm("fork", 2, 1.0)


def test_expected_token_cost_of_each_kind():
    assert expected_tokens(NOOP, 100.0, 0.5) == 0.0
    assert expected_tokens(Arm("branch", 4, 1.0), 100.0, 0.25) == 300.0
    assert expected_tokens(Arm("branch", 4, 1.0), 100.0, 1.5) == 0.0  # clamped: nothing left to write
    assert expected_tokens(Arm("resample", 2, 1.0), 100.0, 0.9) == 200.0  # a fresh sample writes it all


def test_arm_features_carry_kind_size_temperature_and_cost():
    feats = Arm("branch", 2, 0.7).features(cost_tokens=250.0)
    assert feats == {"branch": 1.0, "n": 0.5, "temp": 0.7, "temp_dev": pytest.approx(-0.3), "cost_k": 0.25}
    assert NOOP.features(0.0) == {"noop": 1.0}


@pytest.mark.parametrize(
    "data, key",
    [
        ({"branch_sizes": [0]}, "branch_sizes"),
        ({"resample_temperatures": [0.0]}, "resample_temperatures"),
        ({"branch_sizes": [], "resample_sizes": []}, "no intervention arms"),
        ({"cost_lambda": -1}, "cost_lambda"),
        ({"window": 10, "min_decisions": 100}, "window"),
        ({"below_threshold_explore": 0.0}, "below_threshold_explore"),
        ({"behaviour_epsilon": 1.5}, "behaviour_epsilon"),
        ({"backend": "sklearn"}, "backend"),
        ({"entropy_treshold": 1.0}, "entropy_threshold"),  # typo: unknown key, the close one named
    ],
)
def test_config_errors_name_the_key(data, key):
    with pytest.raises(ConfigError, match=key):
        build(RailConfig, data)


def test_the_arms_cache_is_bounded_when_every_tuple_is_new():
    """A replay builds an arms tuple per logged record: the cache must not grow with them."""
    from controller.rail.arms import ArmsCache

    cache = ArmsCache(limit=8)
    calls = []
    for i in range(100):
        arms = (NOOP, parse_arm(f"branch_b{1 + i % 3}_t1"))
        assert cache.get(arms, lambda a: calls.append(a) or len(a)) == 2
        assert cache.get(arms, lambda a: calls.append(a) or -1) == 2  # same tuple: cached
        assert len(cache._entries) <= 8
    assert len(calls) == 100


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.95, 1.5, -0.5])
def test_a_context_costs_each_arm_as_expected_tokens_does(fraction):
    """``Context.build`` takes the cost rule apart once per arms tuple; it must agree with
    ``expected_tokens``, the rule itself, arm by arm."""
    from controller.rail.features import Context

    arms = build_arms(RailConfig(branch_sizes=(1, 4), resample_sizes=(2,)))
    ctx = Context.build("token", {"length_estimate": 0.137, "position_fraction": fraction}, arms)
    assert ctx.costs == tuple(expected_tokens(a, 137.0, fraction) for a in arms)
    assert any(c > 0 for c in ctx.costs) and ctx.costs[0] == 0.0
