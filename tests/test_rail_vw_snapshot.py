"""The numpy copy of VW's model that scores RAIL's decisions (controller/rail/vw_snapshot.py)."""

from __future__ import annotations

import random

import pytest

from controller.rail.arms import build_arms
from controller.rail.bandit import ControllerStateError
from controller.rail.config import RailConfig
from controller.rail.features import Context
from controller.rail.learners import build_learner
from controller.rail.vw_backend import VWLearner
from pipeline.config.build import ConfigError

ARMS = build_arms(RailConfig())
NO_BRANCH = tuple(a for a in ARMS if a.kind != "branch")
KEYS = [f"f{i}" for i in range(12)]


def context(rng: random.Random, arms=ARMS, keys=KEYS) -> Context:
    features = {k: rng.uniform(-1.0, 1.0) for k in keys}
    features["length_estimate"] = rng.uniform(0.005, 0.2)
    features["position_fraction"] = rng.uniform(0.0, 0.9)
    return Context.build("token", features, arms)


def train(learner: VWLearner, rounds: int, rng: random.Random) -> None:
    for i in range(rounds):
        ctx = context(rng, ARMS if i % 3 else NO_BRANCH)
        d = learner.predict_one(ctx)
        # A reward that depends on the context and the arm, so the model is far from zero.
        learner.learn_one(ctx, d, 0.2 * d.action / len(ctx.arms) * ctx.features["f0"] + rng.gauss(0, 0.1))


def twins(every: int, rounds: int = 300) -> tuple[VWLearner, VWLearner]:
    """A VW-per-decision learner and a snapshot learner with the same weights."""
    exact = VWLearner(seed=3)
    train(exact, rounds, random.Random(0))
    snap = VWLearner(seed=3, snapshot_every=every)
    snap.load_state_dict(exact.state_dict())
    return exact, snap


def test_snapshot_scores_like_vw_itself():
    exact, snap = twins(every=64)
    rng = random.Random(1)
    for i in range(40):
        ctx = context(rng, ARMS if i % 2 else NO_BRANCH)
        probs, gains = snap.distribution(ctx)
        vw_probs, vw_gains = exact.distribution(ctx)
        assert gains == pytest.approx(vw_gains, abs=1e-5)  # VW's weights are float32
        # SquareCB computed here matches VW's own at the same example count.
        assert probs == pytest.approx(vw_probs, abs=1e-5)
        assert sum(probs) == pytest.approx(1.0, abs=1e-12) and min(probs) > 0
    assert max(abs(g) for g in gains) > 0.01  # a trained model, not all zeros


def test_a_batch_scores_like_one_at_a_time():
    _, snap = twins(every=64)
    rng = random.Random(2)
    contexts = [context(rng, ARMS if i % 2 else NO_BRANCH) for i in range(25)]
    batch = snap.distributions(contexts)
    for ctx, (probs, gains) in zip(contexts, batch):
        one_probs, one_gains = snap.distribution(ctx)
        assert probs == pytest.approx(one_probs, abs=1e-12) and gains == pytest.approx(one_gains, abs=1e-12)


def test_the_snapshot_is_fixed_between_refreshes_and_renewed_after_learning():
    _, snap = twins(every=10)
    rng = random.Random(3)
    probe = context(rng)
    before = snap.distribution(probe)
    taken = snap.snapshot.learned
    for _ in range(9):  # learning alone does not move the policy that acts ...
        ctx = context(rng)
        snap.learn_one(ctx, snap.predict_one(ctx), 1.0)
        assert snap.distribution(probe) == before and snap.snapshot.learned == taken
    ctx = context(rng)
    snap.learn_one(ctx, snap.predict_one(ctx), 1.0)  # ... until `every` examples: a new snapshot
    assert snap.snapshot.learned == taken + 10 == snap.learned
    assert snap.distribution(probe) != before


def test_with_growth_copies_are_read_every_share_of_the_history_not_every_n_examples():
    """``snapshot_growth``: a new copy once the examples since the last reach both
    ``snapshot_every`` and the share of all learned so far."""
    snap = VWLearner(seed=3, snapshot_every=8, snapshot_growth=0.25)
    rng = random.Random(7)
    snap.distribution(context(rng))  # the first decision takes the first copy
    taken = [snap.snapshot.learned]
    for _ in range(200):
        ctx = context(rng)
        snap.learn_one(ctx, snap.predict_one(ctx), rng.uniform(-1.0, 1.0))
        if snap.snapshot.learned != taken[-1]:
            taken.append(snap.snapshot.learned)
    # The rule worked out by hand: every 8 examples until 8 is a quarter of the history (32),
    # then each gap a quarter of the count at the new copy.
    assert taken == [0, 8, 16, 24, 32, 43, 58, 78, 104, 139, 186]
    assert snap.snapshot.learned <= snap.learned < 186 + max(8, 0.25 * 248)
    plain = VWLearner(seed=3, snapshot_every=8)
    assert plain.snapshot_growth == 0.0
    with pytest.raises(ValueError, match="snapshot_growth=1.5 must be in"):
        VWLearner(snapshot_every=8, snapshot_growth=1.5)


def test_a_refreshed_snapshot_reads_the_model_as_a_fresh_probe_does():
    """Refreshes reuse the probes' text (formatted once per keys and arms): each must read the
    model it is taken from exactly as probes formatted anew would."""
    from controller.rail.vw_snapshot import LinearSnapshot

    _, snap = twins(every=10)
    rng = random.Random(6)
    snap.distribution(context(rng))
    for _ in range(3):  # three refreshes over the same keys and arms
        for _ in range(10):
            ctx = context(rng)
            snap.learn_one(ctx, snap.predict_one(ctx), rng.uniform(-1.0, 1.0))
        taken = snap.snapshot
        fresh = LinearSnapshot.probe(snap._costs, taken.keys, taken.arms(), taken.learned)
        assert taken.state() == fresh.state()
    assert len(snap._probe_texts) == 1


def test_a_new_feature_or_arm_widens_the_snapshot_from_the_current_model():
    exact, snap = twins(every=64)
    rng = random.Random(4)
    ctx = context(rng, NO_BRANCH)
    snap.distribution(ctx)
    snap.snapshot = None
    snap.distribution(ctx)  # a snapshot over the arms without branches only
    assert "branch_b2_t1" not in snap.snapshot.arm_names
    wider = context(rng, ARMS, KEYS + ["new_feature"])
    gains = snap.distribution(wider)[1]
    assert "new_feature" in snap.snapshot.keys and "branch_b2_t1" in snap.snapshot.arm_names
    assert gains == pytest.approx(exact.distribution(wider)[1], abs=1e-5)


def test_a_resumed_learner_decides_as_the_uninterrupted_one():
    rng = random.Random(5)
    a = VWLearner(seed=7, snapshot_every=16)
    train(a, 100, rng)  # mid-interval: the snapshot is older than the weights
    assert a.snapshot.learned < a.learned
    b = VWLearner(seed=7, snapshot_every=16)
    b.load_state_dict(a.state_dict())
    for i in range(60):
        ctx = context(rng)
        da, db = a.predict_one(ctx), b.predict_one(ctx)
        assert da == db
        a.learn_one(ctx, da, 0.1 * i % 0.3)
        b.learn_one(ctx, db, 0.1 * i % 0.3)


def test_a_corrupt_snapshot_in_a_state_is_named():
    _, snap = twins(every=8, rounds=40)
    snap.distribution(context(random.Random(6)))  # the first decision takes the snapshot
    state = snap.state_dict()
    state["snapshot"]["arms"][0] = "teleport"
    with pytest.raises(ControllerStateError, match="corrupt"):
        VWLearner(seed=3, snapshot_every=8).load_state_dict(state)


def test_the_config_builds_a_snapshot_learner_and_rejects_a_negative_period():
    assert build_learner(RailConfig(), seed=0).snapshot_every == RailConfig().vw_snapshot_every > 0
    assert build_learner(RailConfig(vw_snapshot_every=0), seed=0).snapshot_every == 0
    with pytest.raises(ConfigError, match="vw_snapshot_every=-1 must be >= 0"):
        RailConfig(vw_snapshot_every=-1)
    assert build_learner(RailConfig(vw_snapshot_growth=0.1), seed=0).snapshot_growth == 0.1
    with pytest.raises(ConfigError, match="vw_snapshot_growth=-0.1 must be in"):
        RailConfig(vw_snapshot_growth=-0.1)
