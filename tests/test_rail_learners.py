"""RAIL learners (vowpalwabbit and river backends) behind one interface."""

from __future__ import annotations

import gc
import math
import random
import time

import pytest

from controller.rail.arms import Arm, build_arms
from controller.rail.bandit import ControllerStateError, Decision, inverse_gap_weighting, sample_index
from controller.rail.config import RailConfig
from controller.rail.features import Context, PrefixInfo, group_features
from controller.rail.learners import build_learner, clone_learner, learner_from_state
from tests.rail_fakes import snapshot

BACKENDS = ("vw", "river")
TWO_ARMS = (Arm("branch", 2, 1.0), Arm("resample", 2, 1.0))


def play(learner, rounds, seed=0):
    """The synthetic bandit: arm 1 pays 1 when x > 0, arm 0 pays 1 otherwise."""
    rng = random.Random(seed)
    correct = []
    for _ in range(rounds):
        x = rng.uniform(-1.0, 1.0)
        ctx = Context.build("token", {"x": x}, TWO_ARMS)
        d = learner.predict_one(ctx)
        best = 1 if x > 0 else 0
        correct.append(d.action == best)
        learner.learn_one(ctx, d, 1.0 if d.action == best else 0.0)
    return correct


@pytest.mark.parametrize("backend", BACKENDS)
def test_learns_the_synthetic_contextual_bandit(backend):
    learner = build_learner(RailConfig(backend=backend), seed=1)
    correct = play(learner, 3000)
    late = sum(correct[-1000:]) / 1000
    assert late > 0.8, f"{backend}: only {late:.2%} correct choices in rounds 2000-3000"
    assert late > sum(correct[:200]) / 200  # it improved on its start
    # The regressor view agrees: the better arm has the higher predicted gain on each side.
    for x, best in ((0.8, 1), (-0.8, 0)):
        gains = learner.predict_gains(Context.build("token", {"x": x}, TWO_ARMS))
        assert gains[best] > gains[1 - best]


@pytest.mark.parametrize("backend", BACKENDS)
def test_propensities_are_positive_and_sum_to_one(backend):
    learner = build_learner(RailConfig(backend=backend), seed=2)
    play(learner, 300)
    arms = build_arms(RailConfig())
    for x in (-1.0, 0.0, 0.3, 1.0):
        ctx = Context.build("rescue", {"x": x, "length_estimate": 0.1}, arms)
        d = learner.predict_one(ctx)
        assert len(d.probabilities) == len(arms) == len(d.predicted_gains)
        assert all(0.0 < p <= 1.0 for p in d.probabilities)
        assert math.fsum(d.probabilities) == pytest.approx(1.0, abs=1e-9)
        assert d.propensity == d.probabilities[d.action] and d.arm == arms[d.action].name
        assert d.predicted_gain == d.predicted_gains[d.action]


@pytest.mark.parametrize("backend", BACKENDS)
def test_probabilities_and_gains_are_in_arm_order(backend):
    arms = build_arms(RailConfig())[1:5]  # four branch arms; the third one pays
    learner = build_learner(RailConfig(backend=backend), seed=9)
    rng = random.Random(1)
    for _ in range(1500):
        ctx = Context.build("token", {"x": rng.uniform(-1, 1)}, arms)
        d = learner.predict_one(ctx)
        learner.learn_one(ctx, d, 0.3 if d.action == 2 else 0.0)
    probs, gains = learner.distribution(Context.build("token", {"x": 0.5}, arms))
    assert max(range(4), key=probs.__getitem__) == 2 and probs[2] > 0.8
    assert max(range(4), key=gains.__getitem__) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_same_choices(backend):
    a = play(build_learner(RailConfig(backend=backend), seed=3), 200)
    b = play(build_learner(RailConfig(backend=backend), seed=3), 200)
    assert a == b


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_round_trip_predicts_the_same(backend):
    cfg = RailConfig(backend=backend)
    learner = build_learner(cfg, seed=4)
    play(learner, 300)
    copy = clone_learner(learner, cfg, seed=99)
    ctx = Context.build("token", {"x": 0.4}, TWO_ARMS)
    assert copy.predict_gains(ctx) == pytest.approx(learner.predict_gains(ctx))
    assert copy.learned == learner.learned
    # Independent afterwards: teaching the copy does not move the original.
    before = learner.predict_gains(ctx)
    for _ in range(50):
        copy.learn_one(ctx, Decision(0, TWO_ARMS[0].name, 0.5, 0.0, (), ()), 5.0)
    assert learner.predict_gains(ctx) == pytest.approx(before)
    assert copy.predict_gains(ctx)[0] != pytest.approx(before[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_corrupt_learner_state_is_a_clear_error(backend):
    cfg = RailConfig(backend=backend)
    state = build_learner(cfg, seed=5).state_dict()
    key = "model" if backend == "vw" else "models"
    blob = state[key]
    truncated = dict(state, **{key: blob[: len(blob) // 2 // 4 * 4]})
    with pytest.raises(ControllerStateError, match="checksum"):
        learner_from_state(truncated, cfg, seed=0)
    with pytest.raises(ControllerStateError, match="base64"):
        learner_from_state(dict(state, **{key: "not base64!!"}), cfg, seed=0)
    with pytest.raises(ControllerStateError, match="corrupt"):
        learner_from_state({k: v for k, v in state.items() if k != "rng"}, cfg, seed=0)
    other = "river" if backend == "vw" else "vw"
    with pytest.raises(ControllerStateError, match="backend"):
        learner_from_state(build_learner(RailConfig(backend=other), seed=0).state_dict(), cfg, seed=0)
    with pytest.raises(ControllerStateError, match="must be a dict"):
        learner_from_state(b"\x00\x01", cfg, seed=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_inputs_are_rejected(backend):
    learner = build_learner(RailConfig(backend=backend), seed=6)
    ctx = Context.build("token", {"x": 1.0}, TWO_ARMS)
    with pytest.raises(ValueError, match="propensity"):
        learner.learn_one(ctx, Decision(0, "a", 0.0, 0.0, (), ()), 1.0)
    with pytest.raises(ValueError, match="reward"):
        learner.learn_one(ctx, Decision(0, "a", 0.5, 0.0, (), ()), math.nan)
    with pytest.raises(ValueError, match="outside"):
        learner.learn_one(ctx, Decision(2, "a", 0.5, 0.0, (), ()), 1.0)
    with pytest.raises(ValueError, match="no arms"):
        learner.predict_one(Context("token", {"x": 1.0}, (), ()))


def test_river_noop_gain_is_zero_by_construction():
    learner = build_learner(RailConfig(backend="river"), seed=7)
    arms = build_arms(RailConfig())[:2]  # noop, branch
    ctx = Context.build("token", {"x": 1.0}, arms)
    for _ in range(20):
        learner.learn_one(ctx, Decision(0, "noop", 0.5, 0.0, (), ()), 3.0)  # ignored: the no-op pays 0
    assert learner.predict_gains(ctx)[0] == 0.0


def test_inverse_gap_weighting_and_sampling():
    assert inverse_gap_weighting([0.5], gamma=100.0) == [1.0]
    probs = inverse_gap_weighting([0.0, 0.1, 0.1], gamma=1e6)  # the first of a tie is "best"
    assert 0 < probs[0] < 1e-4 and probs[2] == pytest.approx(1 / 3) and probs[1] == pytest.approx(2 / 3, abs=1e-4)
    far = inverse_gap_weighting([0.0, 1.0], gamma=1e6)  # a clear gap: nearly greedy, never zero
    assert far[1] > 0.999 and far[0] > 0
    with pytest.raises(ValueError, match="no arms"):
        inverse_gap_weighting([], gamma=1.0)
    assert [sample_index((0.2, 0.5, 0.3), u) for u in (0.0, 0.19, 0.2, 0.69, 0.7, 0.999999)] == [0, 0, 1, 1, 2, 2]
    assert sample_index((0.5, 0.5 - 1e-12), 0.99999999999999) == 1  # rounding past the last sum


@pytest.mark.parametrize("backend", BACKENDS)
def test_decision_latency_p99(backend):
    """predict_one + learn_one on a realistic context (21 features, 11 arms). Reported with
    ``-s``; the bound only catches gross regressions on this shared 2-core machine."""
    learner = build_learner(RailConfig(backend=backend), seed=8)
    arms = build_arms(RailConfig())
    rng = random.Random(0)
    times = []
    gc_was = gc.isenabled()
    gc.disable()  # measure the learner, not the collector
    try:
        for _i in range(600):
            snap = snapshot(rewards=(0.0,) * rng.randint(1, 6), in_flight=rng.randint(0, 3))
            f = group_features(
                snap, "token", PrefixInfo(rng.random(), rng.random() * 3, True, -rng.random()), 80.0, 0, 0
            )
            ctx = Context.build("token", f, arms)
            start = time.perf_counter_ns()
            d = learner.predict_one(ctx)
            learner.learn_one(ctx, d, rng.random() * 0.2 - 0.05)
            times.append(time.perf_counter_ns() - start)
    finally:
        if gc_was:
            gc.enable()
    times = sorted(times[100:])
    p50, p99 = times[len(times) // 2] / 1e3, times[int(0.99 * len(times))] / 1e3
    print(f"\n{backend}: predict_one+learn_one p50 {p50:.0f} us, p99 {p99:.0f} us (11 arms)")
    assert p99 < 20_000
