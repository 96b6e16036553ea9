"""Pick RAIL's learner backend from the config (adapters are imported only when chosen).

Both backends answer the same calls: a decision over a context's arms (probabilities that sum
to 1, the chosen arm's propensity), learning its reward, and the predicted gains, of which the
no-op's is 0 by construction.

>>> from controller.rail.arms import build_arms
>>> from controller.rail.config import RailConfig
>>> from controller.rail.features import Context
>>> ctx = Context.build("token", {"x": 1.0, "length_estimate": 0.1}, build_arms(RailConfig())[:3])
>>> for backend in ("vw", "river"):
...     learner = build_learner(RailConfig(backend=backend), seed=1)
...     d = learner.predict_one(ctx)
...     learner.learn_one(ctx, d, reward=0.2)
...     print(type(learner).__name__, len(d.probabilities), round(sum(d.probabilities), 6), 0 < d.propensity <= 1,
...           learner.learned, abs(learner.predict_gains(ctx)[0]))
VWLearner 3 1.0 True 1 0.0
RiverLearner 3 1.0 True 1 0.0
"""

from __future__ import annotations

from typing import Any

from controller.rail.bandit import BanditLearner, ControllerStateError
from controller.rail.config import RailConfig


def build_learner(config: RailConfig, seed: int) -> BanditLearner:
    """The ``config.backend`` learner, seeded with ``seed``."""
    if config.backend == "vw":
        from controller.rail.vw_backend import VWLearner

        return VWLearner(
            learning_rate=config.learning_rate,
            power_t=config.power_t,
            gamma_scale=config.gamma_scale,
            gamma_exponent=config.gamma_exponent,
            extra_args=config.vw_extra_args,
            seed=seed,
            snapshot_every=config.vw_snapshot_every,
            snapshot_growth=config.vw_snapshot_growth,
        )
    if config.backend == "river":
        from controller.rail.river_backend import RiverLearner

        return RiverLearner(
            learning_rate=config.learning_rate * config.river_lr_scale,
            huber_epsilon=config.huber_epsilon,
            gamma_scale=config.gamma_scale,
            gamma_exponent=config.gamma_exponent,
            seed=seed,
        )
    raise ValueError(f"controller.rail.backend={config.backend!r} must be 'vw' or 'river'")


def clone_learner(learner: BanditLearner, config: RailConfig, seed: int) -> BanditLearner:
    """An independent copy of ``learner`` (same weights and scoring snapshot, so the same
    predictions; its own future), e.g. the frozen baseline."""
    copy = build_learner(config, seed)
    copy.load_state_dict(learner.state_dict())
    return copy


def learner_from_state(state: Any, config: RailConfig, seed: int) -> BanditLearner:
    """A learner restored from ``state``; ``ControllerStateError`` if it is not a learner state."""
    if not isinstance(state, dict):
        raise ControllerStateError(f"learner state must be a dict, got {type(state).__name__}")
    learner = build_learner(config, seed)
    learner.load_state_dict(state)
    return learner
