"""RAIL context features: values, sanitisation of extremes, and errors naming the feature."""

from __future__ import annotations

import math

import pytest

from controller.rail.arms import build_arms
from controller.rail.config import RailConfig
from controller.rail.features import (
    ENTROPY_CAP,
    LOGPROB_FLOOR,
    Context,
    PrefixInfo,
    check_features,
    group_features,
)
from tests.rail_fakes import snapshot

ARMS = build_arms(RailConfig())


def test_group_features_describe_the_partial_group():
    snap = snapshot(rewards=(1.0, 0.0, 0.0), in_flight=1, target_size=8, policy_version=5)
    f = group_features(snap, "rescue", PrefixInfo(0.25, 1.7, True, -0.4), 120.0, policy_age=2, interventions=1)
    assert (f["point_rescue"], f["point_extend"], f["point_token"]) == (1.0, 0.0, 0.0)
    assert f["post_a"] == pytest.approx(2 / 8) and f["post_b"] == pytest.approx(3 / 8)
    assert f["post_mean"] == pytest.approx(2 / 5)
    assert (f["probe_all_fail"], f["probe_all_success"], f["probe_mixed"]) == (0.0, 0.0, 1.0)
    assert f["successes"] == pytest.approx(1 / 8) and f["failures"] == pytest.approx(2 / 8)
    assert f["in_flight"] == pytest.approx(1 / 8) and f["launched"] == pytest.approx(4 / 8)
    assert f["position_fraction"] == 0.25 and f["token_entropy"] == 1.7 and f["entropy_known"] == 1.0
    assert f["prefix_mean_logprob"] == -0.4
    assert f["policy_age"] == 2.0 and f["interventions"] == 1.0
    assert f["length_estimate"] == pytest.approx(0.12)
    assert f["prompt_len"] == pytest.approx(math.log1p(3) / 10)
    assert all(math.isfinite(v) for v in f.values())


def test_probe_outcome_one_hot_and_empty_group():
    fail = group_features(snapshot(rewards=(0.0,) * 4), "extend", PrefixInfo(), 100.0, 0, 0)
    win = group_features(snapshot(rewards=(1.0,) * 4), "extend", PrefixInfo(), 100.0, 0, 0)
    empty = group_features(snapshot(rewards=()), "token", PrefixInfo(), 100.0, 0, 0)
    assert (fail["probe_all_fail"], fail["probe_all_success"]) == (1.0, 0.0)
    assert (win["probe_all_fail"], win["probe_all_success"]) == (0.0, 1.0)
    assert (empty["probe_all_fail"], empty["probe_all_success"], empty["probe_mixed"]) == (0.0, 0.0, 0.0)


def test_unknown_entropy_is_zero_with_a_flag():
    f = group_features(snapshot(), "token", PrefixInfo(0.5, float("nan"), False, -1.0), 100.0, 0, 0)
    assert f["token_entropy"] == 0.0 and f["entropy_known"] == 0.0


def test_infinite_logprob_and_entropy_are_clamped_not_errors():
    f = group_features(snapshot(), "token", PrefixInfo(0.5, math.inf, True, -math.inf), 100.0, 0, 0)
    assert f["prefix_mean_logprob"] == -LOGPROB_FLOOR
    assert f["token_entropy"] == ENTROPY_CAP


@pytest.mark.parametrize(
    "field, value",
    [
        ("prefix_mean_logprob", math.nan),
        ("token_entropy", math.nan),
        ("position_fraction", math.inf),
        ("position_fraction", math.nan),
    ],
)
def test_nan_or_other_infinities_raise_naming_the_feature(field, value):
    prefix = PrefixInfo(
        **{
            "position_fraction": 0.5,
            "token_entropy": 1.0,
            "entropy_known": True,
            "prefix_mean_logprob": -1.0,
            field: value,
        }
    )
    with pytest.raises(ValueError, match=f"feature '{field}'"):
        group_features(snapshot(), "token", prefix, 100.0, 0, 0)


def test_check_features_rejects_nan_and_inf_by_name():
    assert check_features({"a": 1, "b": -2.5}) == {"a": 1.0, "b": -2.5}
    with pytest.raises(ValueError, match="feature 'b'=inf"):
        check_features({"a": 1.0, "b": math.inf})
    with pytest.raises(ValueError, match="feature 'length_estimate'=nan"):
        Context.build("token", {"length_estimate": math.nan}, ARMS)


def test_unknown_decision_point_is_rejected():
    with pytest.raises(ValueError, match="decision point 'later'"):
        group_features(snapshot(), "later", PrefixInfo(), 100.0, 0, 0)


def test_context_costs_follow_length_and_prefix_fraction():
    ctx = Context.build("token", {"length_estimate": 0.2, "position_fraction": 0.75}, ARMS)
    costs = dict(zip(ctx.names, ctx.costs))
    assert costs["noop"] == 0.0
    assert costs["branch_b2_t1"] == pytest.approx(2 * 200 * 0.25)
    assert costs["resample_n4_t1.3"] == pytest.approx(4 * 200)
    assert ctx.index("branch_b4_t0.7") == ctx.names.index("branch_b4_t0.7")
    with pytest.raises(ValueError, match="not available here"):
        ctx.index("branch_b8_t1")


def test_empty_arm_set_is_a_clear_error():
    with pytest.raises(ValueError, match="no arms"):
        Context.build("rescue", {"x": 1.0}, ())
    with pytest.raises(ValueError, match="one expected cost per arm"):
        Context("rescue", {}, ARMS[:2], (0.0,))
