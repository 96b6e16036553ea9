"""The learner's side of a run: train on a batch, push the weights, score references, evaluate.

``LearnerStep`` carries out the tracker's ``Train`` and ``Evaluate`` actions and answers with
the messages that report them (``StepDone``, ``Evaluated``); it keeps no run state and writes
no budget -- what a step consumed travels in its ``StepDone`` and the tracker books it. A step
trains on the batch as it is in memory (where the run's learner timing runs its computations:
in a worker thread, or inline on the simulator's virtual clock; ``pipeline.shells.learner_timing``), then
records it in the buffer (``pipeline.store.buffer.ArrowBuffer``: Arrow segments on disk) with the
advantages the learner's step reported, installs the new weights in the engine, scores the
reference responses of the prompts next in line (``gate.sara.reference_prior``), evaluates the
held-out prompts when asked, and keeps a copy of the learner's state when a checkpoint is due.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from pipeline.core.actions import Train
from pipeline.core.messages import Evaluated, StepDone
from pipeline.shells.parts import RunOutputs, RunParts
from pipeline.types import FinishReason, Prompt, Rollout, StepResult, TrainBatch


class LearnerStep:
    """Runs learner steps and evaluations for one orchestrator (``parts``: its learner, engine,
    scoring service, evaluator and reference screen; ``run``: where the learner's computations
    run, its learner timing's ``run``; ``outputs.buffer``: where trained batches go, read at each
    step)."""

    def __init__(
        self,
        parts: RunParts,
        run: Callable[..., Awaitable[Any]],
        outputs: RunOutputs | None = None,
    ):
        self.parts = parts
        self.run = run
        self.learner = parts.learner
        self.outputs = outputs if outputs is not None else RunOutputs()
        if parts.reference is not None and not callable(getattr(parts.learner, "logprobs", None)):
            raise TypeError(
                f"gate.sara.reference_prior needs a learner that scores log-probs (logprobs(rollouts)); "
                f"{type(parts.learner).__name__} has none: use the torch learner or set reference_prior=false"
            )
        self._step_ended = self._run_started = time.monotonic()
        self._eval_wall_s = 0.0

    async def __call__(self, train: Train) -> StepDone:
        """One step on ``train.batch``, and what ``train`` asks for after it."""
        parts = self.parts
        result = await self.run(self._train, train.batch)
        await parts.engine.update_weights(self.learner.weights())
        await self.score_references()
        now = time.monotonic()
        step_wall_s, self._step_ended = now - self._step_ended, now
        # A deep copy now, before the next step starts mutating the weights in its thread.
        learner_state = copy.deepcopy(self.learner.state_dict()) if train.keep_state else None
        evaluation = await self._evaluate(train.batch.step + 1) if train.evaluate else None
        scoring = parts.scoring
        return StepDone(
            batch=train.batch,
            result=result,
            policy_version=parts.engine.policy_version,
            rewards=scoring.health.report(),
            timing={"pipeline/step_wall_s": step_wall_s, **self._timing()},
            evaluation=evaluation,
            learner_state=learner_state,
        )

    async def evaluate(self, step: int) -> Evaluated:
        """The held-out evaluation of the current policy (the ``Evaluate`` action)."""
        evaluation = await self._evaluate(step)
        return Evaluated(step, evaluation, self._timing())

    def _train(self, batch: TrainBatch) -> StepResult:
        """The learner's step on the batch as it is, then the batch into the buffer behind it."""
        result = self.learner.step(batch)
        buffer = self.outputs.buffer
        if buffer is not None:
            buffer.put(batch, result.advantages)  # the step's own, not computed a second time
        return result

    def restore(self, learner_state: dict) -> None:
        """Load a checkpoint's learner state (the one ``Train.keep_state`` took) and put its
        weights in the engine. Called before the run, outside an event loop."""
        self.learner.load_state_dict(learner_state)
        anyio.run(self.parts.engine.update_weights, self.learner.weights())

    async def _evaluate(self, step: int) -> dict[str, float]:
        started = time.monotonic()
        evaluation = await self.parts.evaluator.evaluate(step)
        self._eval_wall_s += time.monotonic() - started
        return evaluation

    def _timing(self) -> dict[str, float]:
        # pipeline/wall_s: of this process (a resume restarts it); eval/wall_s_total: evaluation's share
        return {"pipeline/wall_s": time.monotonic() - self._run_started, "eval/wall_s_total": self._eval_wall_s}

    async def score_references(self) -> None:
        """Score the reference responses of the prompts next in line with the learner's current
        weights, the ones the engine samples with next (``gate.sara.reference_prior``; nothing
        without a reference screen)."""
        reference = self.parts.reference
        if reference is None:
            return
        prompts = reference.wanted()
        if not prompts:
            return
        score = functools.partial(self._reference_logprobs, prompts)
        logprobs = await self.run(score)
        tokens = sum(len(p.token_ids) + len(reference.references[p.prompt_id]) for p in prompts)
        reference.update(logprobs, tokens)

    def _reference_logprobs(self, prompts: list[Prompt]) -> dict[int, float]:
        refs = self.parts.reference.references
        rollouts = [
            Rollout(f"reference-{p.prompt_id}", 0, p.token_ids, refs[p.prompt_id], (), 1.0, FinishReason.STOP, -1)
            for p in prompts
        ]
        return {p.prompt_id: float(sum(lps)) for p, lps in zip(prompts, self.learner.logprobs(rollouts))}
