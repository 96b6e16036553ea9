"""Learner steps as the group tracker accounts for them.

A ``StepDone`` says what a step consumed and what came of it; ``StepLog`` books it: the tokens
and rollouts trained, their staleness and the reward counters go into the run's ``Budget`` (the
tracker's, its one writer), the step's metrics line is made, a held-out evaluation is kept with
the costs so far, and one at ``orchestrator.target_accuracy`` ends the run.

>>> from pipeline.config.sections import OrchestratorConfig
>>> from pipeline.core.messages import StepDone
>>> from pipeline.metrics import Budget
>>> from pipeline.types import StepResult, TrainBatch
>>> log = StepLog(Budget(), OrchestratorConfig(target_accuracy=0.5))
>>> log.consumed(StepDone(TrainBatch(0, ()), StepResult(1, {}), policy_version=1))  # staleness per rollout: none
[]
>>> log.evaluated(2, {"eval/accuracy": 0.6}, {}, costs={})
'target accuracy 0.5 reached at step 2'
>>> [e["step"] for e in log.evals]
[2.0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pipeline.config.sections import OrchestratorConfig
from pipeline.core.messages import RewardCounts, StepDone
from pipeline.metrics import Budget


class StepLog:
    """The budget's step-side entries, each step's metrics, and every evaluation record."""

    def __init__(self, budget: Budget, config: OrchestratorConfig):
        self.budget = budget
        self.config = config
        self.evals: list[dict[str, float]] = []

    def consumed(self, done: StepDone) -> list[int]:
        """Book what the step trained on; the staleness of each rollout it trained on."""
        b = self.budget
        batch = done.batch
        b.tokens_trained += sum(g.trained_tokens for g in batch.groups)
        stale = [done.policy_version - 1 - r.policy_version for g in batch.groups for r in g.rollouts]
        b.rollouts_trained += len(stale)
        b.staleness_sum += sum(stale)
        b.staleness_max = max(b.staleness_max, max(stale, default=0))
        self.count_rewards(done.rewards)
        return stale

    def count_rewards(self, rewards: RewardCounts) -> None:
        """The scoring service's counts, cumulative over the run (a step's, or the run's end)."""
        b = self.budget
        b.reward_errors, b.reward_timeouts, b.rewards_none = rewards.errors, rewards.timeouts, rewards.no_reward

    def reward_counts(self) -> RewardCounts:
        """The reward counts the budget holds (a resumed run's: the checkpoint's)."""
        b = self.budget
        return RewardCounts(b.reward_errors, b.reward_timeouts, b.rewards_none)

    def metrics(
        self, done: StepDone, stale: list[int], context: Mapping[str, float], parts: Mapping[str, float]
    ) -> dict[str, Any]:
        """The step's metrics line: the budget, the learner's result, the batch, ``context`` (the
        tracker's: open groups, engine time) and ``parts`` (the gate's and the controller's)."""
        batch = done.batch
        metrics: dict[str, Any] = {
            **self.budget.as_metrics(),
            **done.result.metrics,
            "pipeline/step_staleness_max": float(max(stale, default=0)),
            "pipeline/batch_effective_fraction": sum(g.is_effective for g in batch.groups) / max(1, len(batch.groups)),
            "pipeline/open_groups": float(context["open_groups"]),
            "pipeline/engine_time": float(context["engine_time"]),
            "pipeline/step_wall_s": float(done.timing.get("pipeline/step_wall_s", 0.0)),
            "engine/policy_version": float(done.policy_version),
        }
        metrics.update(parts)
        return metrics

    def evaluated(
        self,
        step: int,
        evaluation: Mapping[str, float],
        gate_metrics: Mapping[str, float],
        costs: Mapping[str, float],
        timing: Mapping[str, float] | None = None,
    ) -> str:
        """Keep one evaluation record with the costs so far; the stop reason when it reaches
        ``target_accuracy`` (else "")."""
        b = self.budget
        timing = timing or {}
        record = {
            "step": float(step),
            "pipeline/rollouts_started": float(b.rollouts_started),
            "pipeline/tokens_generated": float(b.tokens_generated),
            "pipeline/engine_time": float(costs.get("engine_time", 0.0)),
            # of this process (a resume restarts it); eval/wall_s_total: evaluation's share
            "pipeline/wall_s": float(timing.get("pipeline/wall_s", 0.0)),
            "eval/wall_s_total": float(timing.get("eval/wall_s_total", 0.0)),
            **gate_metrics,
            **evaluation,
        }
        self.evals.append(record)
        target = self.config.target_accuracy
        accuracy = evaluation.get("eval/accuracy", math.nan)
        if target and accuracy >= target:
            return f"target accuracy {target} reached at step {step}"
        return ""
