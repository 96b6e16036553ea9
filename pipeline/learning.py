"""One learner step as the orchestrator runs it: train, record, push weights, measure, evaluate.

``LearnerStep`` trains on a ``TrainBatch`` from memory (in a worker thread, or inline on the
simulator's virtual clock), then records it in the buffer (``pipeline.store.buffer.ArrowBuffer``:
Arrow segments on disk) with the learner's advantages, pushes the new weights into the engine, writes
the step's metrics (the budget, the learner's, the gate's and the controller's, namespaced),
evaluates every ``eval_every`` steps, and keeps the evaluation records. A held-out accuracy at
or above ``orchestrator.target_accuracy`` stops the run through the tracker's ``stop_reason``.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from typing import Callable

import anyio.to_thread

from pipeline.clock import VirtualClock, WallClock
from pipeline.config.sections import OrchestratorConfig
from pipeline.engines.base import Engine
from pipeline.metrics import MetricsWriter, NullMetricsWriter
from pipeline.protocols import Buffer, Evaluator, Learner, ReferenceScores
from pipeline.tasks.rewards.scoring import ScoringService
from pipeline.tracker import GroupTracker
from pipeline.types import FinishReason, Prompt, Rollout, StepResult, TrainBatch


class LearnerStep:
    """Runs learner steps for one orchestrator; ``evals`` holds every evaluation record.

    ``checkpoint_due(step)`` says whether the learner's state must be taken after ``step``
    (a deep copy, before the next step mutates the weights in its thread).
    """

    def __init__(
        self,
        learner: Learner,
        engine: Engine,
        tracker: GroupTracker,
        config: OrchestratorConfig,
        *,
        clock: VirtualClock | WallClock,
        scoring: ScoringService,
        evaluator: Evaluator | None = None,
        buffer: Buffer | None = None,
        metrics: MetricsWriter | NullMetricsWriter | None = None,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
        checkpoint_due: Callable[[int], bool] = lambda step: False,
        reference: ReferenceScores | None = None,
    ):
        self.learner = learner
        self.engine = engine
        self.tracker = tracker
        self.config = config
        self.clock = clock
        self.scoring = scoring
        self.evaluator = evaluator
        self.buffer = buffer
        self.metrics = metrics if metrics is not None else NullMetricsWriter()
        self.on_step = on_step
        self.checkpoint_due = checkpoint_due
        self.reference = reference
        if reference is not None and not callable(getattr(learner, "logprobs", None)):
            raise TypeError(f"gate.sara.reference_prior needs a learner that scores log-probs (logprobs(rollouts)); "
                            f"{type(learner).__name__} has none: use the torch learner or set reference_prior=false")
        self.evals: list[dict[str, float]] = []
        self._step_started = self._run_started = time.monotonic()
        self._eval_wall_s = 0.0

    async def __call__(self, batch: TrainBatch, in_thread: bool) -> tuple[TrainBatch, StepResult, dict | None]:
        """One step on ``batch``: the batch trained on, the learner's result, and its state
        when a checkpoint is due after this step (else None)."""
        self.tracker.budget.tokens_trained += sum(g.trained_tokens for g in batch.groups)
        result = await anyio.to_thread.run_sync(self._train, batch) if in_thread else self._train(batch)
        await self.engine.update_weights(self.learner.weights())
        await self.score_references(in_thread)
        metrics = self._step_metrics(batch, result)
        step = batch.step + 1
        # A deep copy now, before the next step starts mutating the weights in its thread.
        learner_state = copy.deepcopy(self.learner.state_dict()) if self.checkpoint_due(step) else None
        if self.evaluator is not None and (
            step == self.config.steps or (self.config.eval_every and step % self.config.eval_every == 0)
        ):
            evaluation = await self.evaluate(step)
            metrics.update(evaluation)
            self.record_eval(step, evaluation)
        self.metrics.write(step, metrics)
        if self.on_step is not None:
            self.on_step(step, metrics)
        return batch, result, learner_state

    def _train(self, batch: TrainBatch) -> StepResult:
        """The learner's step on the batch as it is, then the batch into the buffer behind it."""
        result = self.learner.step(batch)
        if self.buffer is not None:
            self.buffer.put(batch, self.learner.advantages(batch))
        return result

    async def score_references(self, in_thread: bool = True) -> None:
        """Score the reference responses of the prompts next in line with the learner's current
        weights, the ones the engine samples with next (``gate.sara.reference_prior``; nothing
        without a reference screen)."""
        if self.reference is None:
            return
        prompts = self.reference.wanted()
        if not prompts:
            return
        score = functools.partial(self._reference_logprobs, prompts)
        logprobs = await anyio.to_thread.run_sync(score) if in_thread else score()
        tokens = sum(len(p.token_ids) + len(self.reference.references[p.prompt_id]) for p in prompts)
        self.reference.update(logprobs, tokens)

    def _reference_logprobs(self, prompts: list[Prompt]) -> dict[int, float]:
        refs = self.reference.references
        rollouts = [Rollout(f"reference-{p.prompt_id}", 0, p.token_ids, refs[p.prompt_id], (), 1.0, FinishReason.STOP, -1)
                    for p in prompts]
        return {p.prompt_id: float(sum(lps)) for p, lps in zip(prompts, self.learner.logprobs(rollouts))}

    def _step_metrics(self, batch: TrainBatch, result: StepResult) -> dict[str, float]:
        version = self.engine.policy_version
        stale = [version - 1 - r.policy_version for g in batch.groups for r in g.rollouts]
        b = self.tracker.budget
        b.rollouts_trained += len(stale)
        b.staleness_sum += sum(stale)
        b.staleness_max = max(b.staleness_max, max(stale, default=0))
        b.reward_errors = self.scoring.errors
        b.reward_timeouts = self.scoring.timeouts
        b.rewards_none = self.scoring.no_reward
        now = time.monotonic()
        metrics = {
            **b.as_metrics(),
            **result.metrics,
            "pipeline/step_staleness_max": float(max(stale, default=0)),
            "pipeline/batch_effective_fraction": sum(g.is_effective for g in batch.groups) / max(1, len(batch.groups)),
            "pipeline/open_groups": float(len(self.tracker.groups)),
            "pipeline/engine_time": float(self.clock.now()),
            "pipeline/step_wall_s": now - self._step_started,
            "engine/policy_version": float(version),
        }
        self._step_started = now
        metrics.update(self.tracker.gate.metrics())
        metrics.update(self.tracker.controller.metrics())
        return metrics

    async def evaluate(self, step: int) -> dict[str, float]:
        started = time.monotonic()
        evaluation = await self.evaluator.evaluate(step)
        self._eval_wall_s += time.monotonic() - started
        return evaluation

    def record_eval(self, step: int, evaluation: dict[str, float]) -> None:
        """Keep one evaluation record (with the costs so far); stop at the target accuracy."""
        b = self.tracker.budget
        # eval/wall_s_total: evaluation's share of the wall clock (benchmarks subtract it).
        record = {"step": float(step), "pipeline/rollouts_started": float(b.rollouts_started),
                  "pipeline/tokens_generated": float(b.tokens_generated), "pipeline/engine_time": float(self.clock.now()),
                  "pipeline/wall_s": time.monotonic() - self._run_started,  # of this process (a resume restarts it)
                  "eval/wall_s_total": self._eval_wall_s,
                  **self.tracker.gate.metrics(), **evaluation}
        self.evals.append(record)
        target = self.config.target_accuracy
        accuracy = evaluation.get("eval/accuracy", math.nan)
        if target and accuracy >= target and not self.tracker.stop_reason:
            self.tracker.stop_reason = f"target accuracy {target} reached at step {step}"
