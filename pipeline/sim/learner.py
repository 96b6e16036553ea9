"""The simulator's learner: applies ``SimWorld.learn`` (the documented training dynamics) to
each train batch. It has no gradient; it exists so that allocation studies run the same
pipeline as real training, in seconds.

It logs no ``learner/noise_scale``: the simulator's training rule is deterministic given the
committed groups' rewards (no gradient, so no gradient noise), and its regime is set directly
by ``sim.progress_exponent`` (1: progress counts every effective group, the noise-limited end;
near 0: progress counts optimiser steps, the step-limited end)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.protocols import Learner
from pipeline.sim.world import SimPolicyState, SimWorld
from pipeline.types import StepResult, TrainBatch


class SimLearner(Learner):
    """Moves the simulated policy from the rewards of committed groups.

    >>> from pipeline.config.sections import SimConfig
    >>> from pipeline.types import CommittedGroup, Rollout, FinishReason, TrainBatch
    >>> world = SimWorld(SimConfig(num_prompts=2, num_eval_prompts=2))
    >>> learner = SimLearner(world, group_size=2, seed=0)
    >>> r = lambda i, x: Rollout(f"r{i}", i, (), (1,), (0.0,), x, FinishReason.STOP, 0)
    >>> batch = TrainBatch(0, (CommittedGroup(0, 0, (r(0, 1.0), r(1, 0.0)), 2, 2),))
    >>> learner.step(batch).metrics["learner/skill"] > world.config.initial_skill
    True
    """

    def __init__(self, world: SimWorld, group_size: int, seed: int, state: SimPolicyState | None = None):
        self.world = world
        self.group_size = group_size
        self._state = state if state is not None else world.initial_state()
        self._rng = np.random.default_rng(seed)
        self._version = 0

    def step(self, batch: TrainBatch) -> StepResult:
        groups = [(g.prompt_id, list(g.rewards)) for g in batch.groups]
        self._state = self.world.learn(self._state, groups, self.group_size, self._rng)
        self._version += 1
        rewards = [r for _, rs in groups for r in rs]
        return StepResult(
            step=batch.step,
            policy_version=self._version,
            metrics={
                "learner/skill": float(self._state.theta),
                "learner/reward_mean": float(np.mean(rewards)) if rewards else 0.0,
                "learner/rollouts": float(len(rewards)),
            },
        )

    def weights(self) -> SimPolicyState:
        return self._state

    def state_dict(self) -> dict[str, Any]:
        return {
            "theta": float(self._state.theta),
            "offsets": self._state.offsets.tolist(),
            "difficulty": self.world.difficulty.tolist(),
            "rng": self._rng.bit_generator.state,
            "version": self._version,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._state = SimPolicyState(float(state["theta"]), np.asarray(state["offsets"], dtype=float))
        self.world.difficulty = np.asarray(state["difficulty"], dtype=float)
        self._rng.bit_generator.state = state["rng"]
        self._version = int(state["version"])
