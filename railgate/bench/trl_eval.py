"""Held-out accuracy during a TRL run, at fixed rollout counts, outside the run's own accounting.

``HeldOut`` samples ``samples`` completions of every held-out prompt from the model being trained
(temperature 1, the training sampler's setting), grades them with the task's reward and reports
the mean over prompts with its 95% interval over prompts, as every held-out accuracy of the
project (``pipeline.intervals.prompt_mean``: Student's t over the per-prompt accuracies). Its random draws come from their own seeded generator
(``torch.random.fork_rng``), so evaluating does not move the training run's random state, and
the same model gives the same figure.

``Curve`` is the ``TrainerCallback`` that evaluates before the first step and each time the
run's generated rollouts pass another ``every``, and at the end. It records, per point, the
rollouts and tokens generated so far and the training CPU-seconds (process time, evaluation
excluded): what ``railgate.bench.trl`` reads rollouts-to-target and cost from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import TrainerCallback

from pipeline.intervals import prompt_mean
from railgate.bench.trl_report import Point


class HeldOut:
    """Accuracy of a model on held-out rows; see the module docstring."""

    def __init__(
        self,
        rows: Sequence[dict[str, Any]],
        reward: Callable[..., list[float]],
        tokenizer: Any,
        max_new_tokens: int,
        samples: int = 4,
        seed: int = 0,
        batch_prompts: int = 64,
    ):
        self.rows = list(rows)
        self.reward = reward
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.samples = samples
        self.seed = seed
        self.batch_prompts = batch_prompts

    def __call__(self, model: Any) -> tuple[float, float]:
        """(mean accuracy over prompts, half-width of its 95% interval; nan with one prompt)."""
        per_prompt: list[float] = []
        was_training = model.training
        model.eval()
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(self.seed)
                for i in range(0, len(self.rows), self.batch_prompts):
                    per_prompt += self._batch(model, self.rows[i : i + self.batch_prompts])
        finally:
            model.train(was_training)
        accuracy = prompt_mean(per_prompt)
        # the t half-width: the bound that [0, 1] did not cut (the table cuts both again)
        return accuracy.mean, max(accuracy.mean - accuracy.lo, accuracy.hi - accuracy.mean)

    def _batch(self, model: Any, rows: list[dict[str, Any]]) -> list[float]:
        tok = self.tokenizer
        texts = [
            tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
            if isinstance(r["prompt"], list)
            else r["prompt"]
            for r in rows
        ]
        side, tok.padding_side = tok.padding_side, "left"
        try:
            enc = tok(
                texts, return_tensors="pt", padding=True, add_special_tokens=not isinstance(rows[0]["prompt"], list)
            )
        finally:
            tok.padding_side = side
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=self.max_new_tokens,
            num_return_sequences=self.samples,
            pad_token_id=tok.pad_token_id,
        )
        completions = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        answers = [r["answer"] for r in rows for _ in range(self.samples)]
        rewards = self.reward([t for t in texts for _ in range(self.samples)], completions, answer=answers)
        return [sum(rewards[i * self.samples : (i + 1) * self.samples]) / self.samples for i in range(len(rows))]


@dataclass
class Curve(TrainerCallback):
    """Evaluates at fixed rollout counts; see the module docstring.

    ``generated()`` gives the run's (rollouts, tokens) so far.
    """

    held_out: HeldOut
    every: int
    generated: Callable[[], tuple[int, int]]
    points: list[Point] = field(default_factory=list)
    eval_cpu_s: float = 0.0
    _start_cpu: float = 0.0
    _next: int = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        self._start_cpu = time.process_time()
        self._next = 0
        self._evaluate(model, state)
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        if self.generated()[0] >= self._next:
            self._evaluate(model, state)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        if not self.points or self.points[-1].rollouts != self.generated()[0]:
            self._evaluate(model, state)
        return control

    def training_cpu_s(self) -> float:
        """Process CPU-seconds since training began, evaluation excluded."""
        return time.process_time() - self._start_cpu - self.eval_cpu_s

    def _evaluate(self, model: Any, state: Any) -> None:
        rollouts, tokens = self.generated()
        cpu = self.training_cpu_s()
        started = time.process_time()
        accuracy, ci = self.held_out(model)
        self.eval_cpu_s += time.process_time() - started
        self.points.append(Point(rollouts, tokens, cpu, accuracy, ci, int(state.global_step)))
        while self._next <= rollouts:
            self._next += self.every
