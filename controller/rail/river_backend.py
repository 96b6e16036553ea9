"""The river learner: one Huber linear regressor of the gain per arm, SquareCB exploration.

Why not river's own contextual policy: ``river.bandit.LinUCBDisjoint`` is the only one in
river 0.26.1 and takes about 90 us a decision here; a per-arm ``LinearRegression`` predicts in
about 1 us and learns in about 25 us, and gives what RAIL needs anyway -- a regressor of each
arm's gain (the paper's controller is a gain regressor trained with a Huber loss). Exploration
is SquareCB's inverse-gap weighting over the predicted gains (``controller.rail.bandit``), the
same rule VW's ``--squarecb`` uses, so the two backends differ only in their regressors.

Each arm's model sees the shared features plus the arm's own (its expected cost changes with
the context). The no-op's gain is 0 by construction, so it has no model and is never learned.
Tracking a drifting policy: plain SGD with a constant step, so old decisions fade out.

This is the only module that imports river. ``controller.rail.learners`` builds it from the
config, with an example of both backends.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from river import linear_model, optim, utils

from controller.rail.bandit import BanditLearner, ControllerStateError, Decision, inverse_gap_weighting
from controller.rail.features import Context
from controller.rail.state import pack_blob, unpack_blob


class RiverLearner(BanditLearner):
    """Per-arm river ``LinearRegression`` (Huber loss, constant-step SGD) + SquareCB.

    Parameters
    ----------
    learning_rate
        SGD step of the weights and the intercept.
    huber_epsilon
        Huber threshold (reward units): errors beyond it count linearly, so a rare large gain
        does not swing the regressor.
    l2
        Ridge penalty.
    gamma_scale, gamma_exponent, seed
        As for ``BanditLearner``.
    """

    name = "river"

    def __init__(
        self,
        learning_rate: float = 0.05,
        huber_epsilon: float = 0.1,
        l2: float = 0.0,
        gamma_scale: float = 10.0,
        gamma_exponent: float = 0.5,
        seed: int = 0,
    ):
        super().__init__(gamma_scale, gamma_exponent, seed)
        self.learning_rate = learning_rate
        self.huber_epsilon = huber_epsilon
        self.l2 = l2
        self._models: dict[str, linear_model.LinearRegression] = {}

    def _model(self, arm: str) -> linear_model.LinearRegression:
        model = self._models.get(arm)
        if model is None:
            model = self._models[arm] = linear_model.LinearRegression(
                optimizer=optim.SGD(self.learning_rate),
                loss=optim.losses.Huber(self.huber_epsilon),
                l2=self.l2,
                intercept_lr=self.learning_rate,
            )
        return model

    @staticmethod
    def _inputs(context: Context, i: int) -> dict[str, float]:
        x = dict(context.features)
        for key, value in context.arms[i].features(context.costs[i]).items():
            x["a:" + key] = value
        return x

    def _distribution(self, context: Context) -> tuple[Sequence[float], Sequence[float]]:
        gains = []
        for i, arm in enumerate(context.arms):
            if arm.is_noop:
                gains.append(0.0)
                continue
            model = self._models.get(arm.name)
            gains.append(float(model.predict_one(self._inputs(context, i))) if model is not None else 0.0)
        return inverse_gap_weighting(gains, self.gamma()), gains

    def _learn(self, context: Context, decision: Decision, reward: float) -> None:
        arm = context.arms[decision.action]
        if arm.is_noop:
            return  # its gain is 0 by construction; nothing to learn
        self._model(arm.name).learn_one(self._inputs(context, decision.action), reward)

    # --- state -----------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return models_state(self._models)

    def _load(self, state: dict[str, Any]) -> None:
        if state.get("format") != "json":
            raise ControllerStateError(
                "river learner state in the pickle format of older releases is not loaded (unpickling can run code); "
                "start the controller fresh, or replay its trace to retrain it (python run.py replay RUN_DIR/trace)"
            )
        data = json.loads(unpack_blob(state["models"], state["sha256"], "the river learner state's models"))
        if not isinstance(data, dict):
            raise ControllerStateError(f"river learner state holds {type(data).__name__}, not a dict of models")
        models = {}
        for arm, saved in data.items():
            self._models.pop(arm, None)
            model = self._model(arm)
            model.intercept = float(saved["intercept"])
            model.optimizer.n_iterations = int(saved["n_iterations"])
            model._weights = utils.VectorDict({str(k): float(v) for k, v in saved["weights"]})
            models[arm] = model
        self._models = models


def models_state(models: dict[str, linear_model.LinearRegression]) -> dict[str, Any]:
    """The per-arm regressors as plain data (never a pickle: a state file or checkpoint may come
    from someone else, and unpickling it could run code): per arm the intercept, SGD's step
    count and the weights, as checksummed base64 JSON."""
    data = {
        arm: {
            "intercept": m.intercept,
            "n_iterations": m.optimizer.n_iterations,
            "weights": [[k, v] for k, v in m._weights.to_dict().items()],
        }
        for arm, m in models.items()
    }
    text, digest = pack_blob(json.dumps(data, separators=(",", ":")).encode())
    return {"format": "json", "models": text, "sha256": digest}
