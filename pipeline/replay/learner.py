"""The learner of a replay: it trains nothing.

A replay (``engine.kind: replay``) serves recorded samples, so no weights it could learn would
change what the engine serves. ``NoLearner`` still takes every batch the tracker cuts and
answers with a ``StepResult``, so that steps, batches, the gates' ``on_step`` and the step
log run as they do in training; its ``weights()`` are a step counter, which the replay engine
accepts and answers with a new policy version (``pipeline.engines.replay``).

>>> from pipeline.types import CommittedGroup, FinishReason, Rollout, TrainBatch
>>> rollout = lambda i, r: Rollout(f"r{i}", i, (), (1, 2), (0.0, 0.0), r, FinishReason.STOP, 0)
>>> batch = TrainBatch(0, (CommittedGroup(0, 0, (rollout(0, 1.0), rollout(1, 0.0)), 2, 4),))
>>> learner = NoLearner()
>>> result = learner.step(batch)
>>> result.policy_version, result.metrics["learner/rollouts"], learner.weights()
(1, 2.0, 1)
"""

from __future__ import annotations

from typing import Any

from pipeline.protocols import Learner
from pipeline.types import StepResult, TrainBatch


class NoLearner(Learner):
    """A learner that changes no weights: each step is counted and reported, nothing more."""

    def __init__(self) -> None:
        self._steps = 0

    def step(self, batch: TrainBatch) -> StepResult:
        self._steps += 1
        rewards = [r for g in batch.groups for r in g.rewards]
        return StepResult(
            step=batch.step,
            policy_version=self._steps,
            metrics={
                "learner/rollouts": float(len(rewards)),
                "learner/reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
            },
        )

    def weights(self) -> int:
        """The steps taken: what ``ReplayEngine.update_weights`` takes (it changes nothing served)."""
        return self._steps

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self._steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._steps = int(state["steps"])
