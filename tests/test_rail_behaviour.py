"""Behaviour policies of shadow mode: their rules, exploration and logged propensities."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from controller.rail.arms import build_arms
from controller.rail.behaviour import ArpoBehaviour, NoneBehaviour, build_behaviour
from controller.rail.config import RailConfig
from controller.rail.features import Context

ARMS = build_arms(RailConfig())
NO_BRANCH = tuple(a for a in ARMS if a.kind != "branch")


def ctx(point, arms=ARMS):
    return Context.build(point, {"length_estimate": 0.1}, arms)


@pytest.mark.parametrize("policy", [NoneBehaviour(0.3, seed=0), ArpoBehaviour(0.3, seed=0)])
@pytest.mark.parametrize("point", ["rescue", "extend", "token"])
def test_distributions_are_proper_with_epsilon_floor(policy, point):
    probs, gains = policy.distribution(ctx(point))
    assert math.fsum(probs) == pytest.approx(1.0)
    assert min(probs) == pytest.approx(0.3 / len(ARMS))  # every arm can be logged
    assert all(math.isnan(g) for g in gains)  # a heuristic has no reward model


def test_rules_pick_the_documented_arms():
    none, arpo = NoneBehaviour(0.0, seed=0), ArpoBehaviour(0.0, seed=0)
    assert ctx("token").arms[none.rule(ctx("token"))].name == "noop"
    assert ctx("token").arms[arpo.rule(ctx("token"))].name == "branch_b2_t1"  # smallest, at T = 1
    assert ctx("rescue").arms[arpo.rule(ctx("rescue"))].name == "branch_b2_t1"
    assert ctx("extend").arms[arpo.rule(ctx("extend"))].name == "noop"  # the gate commits: leave it
    rescue = ctx("rescue", NO_BRANCH)
    assert rescue.arms[arpo.rule(rescue)].name == "resample_n2_t1"  # no prefix: resample instead
    token = ctx("token", NO_BRANCH)
    assert token.arms[arpo.rule(token)].name == "noop"


def test_sampled_frequencies_match_the_logged_propensities():
    policy = ArpoBehaviour(0.5, seed=1)
    c = ctx("token")
    counts = Counter(policy.predict_one(c).action for _ in range(20000))
    probs = policy.distribution(c)[0]
    for i, p in enumerate(probs):
        assert counts[i] / 20000 == pytest.approx(p, abs=0.015)
    d = policy.predict_one(c)
    assert d.propensity == probs[d.action] and d.arm == c.arms[d.action].name


def test_seeded_and_restorable():
    a, b = ArpoBehaviour(0.5, seed=3), ArpoBehaviour(0.5, seed=3)
    first = [a.predict_one(ctx("token")).action for _ in range(50)]
    assert first == [b.predict_one(ctx("token")).action for _ in range(50)]
    state = a.state_dict()
    after = [a.predict_one(ctx("token")).action for _ in range(20)]
    b.load_state_dict(state)
    assert after == [b.predict_one(ctx("token")).action for _ in range(20)]


def test_build_behaviour_and_bad_epsilon():
    assert isinstance(build_behaviour(RailConfig(behaviour="none"), 0), NoneBehaviour)
    assert isinstance(build_behaviour(RailConfig(behaviour="arpo", behaviour_epsilon=0.1), 0), ArpoBehaviour)
    with pytest.raises(ValueError, match="epsilon"):
        NoneBehaviour(-0.1)
    with pytest.raises(ValueError, match="no arms"):
        NoneBehaviour(0.1).distribution(Context("token", {}, (), ()))
