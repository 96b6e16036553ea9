"""The VW backend's example text: the templated shared line is the per-feature formatting."""

import math
import random

from controller.rail.arms import build_arms
from controller.rail.config import RailConfig
from controller.rail.features import Context
from controller.rail.vw_backend import VWLearner


def _reference_shared(learner: VWLearner, features: dict[str, float]) -> str:
    return "shared |s " + " ".join(f"{learner._name(k)}:{v:.6g}" for k, v in features.items())


def test_shared_line_matches_per_feature_formatting():
    learner = VWLearner(seed=0)
    rng = random.Random(0)
    arms = build_arms(RailConfig())[:3]
    names = ["length_estimate", "a b", "x:y", "p|q", "pct%", "z"]
    specials = [0.0, -0.0, 1e-7, 123456789.0, 1.5e300, math.inf, -math.inf, 2 / 3]
    for trial in range(300):
        keys = names[: 1 + trial % len(names)]
        features = {
            k: (rng.choice(specials) if rng.random() < 0.3 else rng.uniform(-1e4, 1e4) * 10 ** rng.randint(-9, 3))
            for k in keys
        }
        features["length_estimate"] = abs(features["length_estimate"]) % 10
        ctx = Context("token", features, arms, (1.0, 2.0, 3.0))
        assert learner._lines(ctx)[0] == _reference_shared(learner, features)


def test_predictions_unchanged_by_repeated_formatting():
    """Same context, same text, same VW scores (the template cache is only a cache)."""
    arms = build_arms(RailConfig())[:3]
    ctx = Context.build("token", {"x": 0.25, "length_estimate": 0.1}, arms)
    a, b = VWLearner(seed=3), VWLearner(seed=3)
    b._lines(Context.build("rescue", {"y": 1.0, "length_estimate": 0.2}, arms))  # fill another template first
    assert a.distribution(ctx) == b.distribution(ctx)
