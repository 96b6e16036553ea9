"""SARA's reference prior in a TRL run: each prompt's reference completion, checked, then scored.

railgate's ``controller.reference.ReferenceScreen`` turns the policy's likelihood of a prompt's
reference response into the prior its group starts from, and skips prompts whose group that
prior says will not be mixed. In a TRL run the reference is a dataset column
(``gate_reference_column``); ``ReferenceScorer`` gives the screen:

* ``references``: each row's reference text as the tokens a completion that writes it would
  hold (the processing class's tokens, no special tokens, then, for an exact reference
  (``gate_reference_exact``), the end-of-sequence token: ``reference_tokens``);
* before a reference is first used, a check that it earns the reward -- the user's reward
  functions score (prompt, reference) like any completion, and a reference at or below
  ``gate_success_threshold`` is dropped (it would bound nothing);
* ``refresh``: before each admission, the screen's wanted prompts (the next ones in the gate's
  order without a score) scored by one teacher-forced forward pass of the current policy
  through TRL's own ``_get_per_token_logps_and_entropies``, split over the processes and
  gathered, so every rank's gate gets the same scores.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from trl.trainer.utils import pad

from controller.reference import ReferenceScreen, reference_tokens
from pipeline.types import Prompt
from railgate.trl.ranks import gather_all, rank_share
from railgate.trl.rows import scalar_reward

REFERENCE_COLUMNS = ("reference", "solution", "answer", "completion")
"""Columns ``gate_reference_column="auto"`` looks for, in this order."""

logger = logging.getLogger(__name__)


def reference_column(setting: str, columns: Sequence[str]) -> str | None:
    """The dataset column of the reference completions (``setting``: a name, or ``auto``).

    >>> reference_column("auto", ["prompt", "answer"]), reference_column("auto", ["prompt"])
    ('answer', None)
    >>> reference_column("target", ["prompt", "answer"])
    Traceback (most recent call last):
    ...
    ValueError: gate_reference_column='target' is not a column of the train dataset (prompt, answer); name the column holding each prompt's reference completion, or set gate_reference_prior=False
    """
    if setting != "auto":
        if setting not in columns:
            raise ValueError(
                f"gate_reference_column={setting!r} is not a column of the train dataset ({', '.join(columns)}); "
                "name the column holding each prompt's reference completion, or set gate_reference_prior=False"
            )
        return setting
    return next((c for c in REFERENCE_COLUMNS if c in columns), None)


class ReferenceScorer:
    """The references of a ``GatedGRPOTrainer``'s dataset and their scoring; see the module docstring."""

    def __init__(self, trainer: Any, column: str, exact: bool):
        self.trainer = trainer
        self.column = column
        dataset = trainer.train_dataset
        texts = {i: str(v) for i, v in enumerate(dataset[column]) if v is not None and str(v).strip()}
        ids = (
            trainer.processing_class(text=list(texts.values()), add_special_tokens=False)["input_ids"] if texts else []
        )
        self.texts = texts
        self.references = {i: reference_tokens(t, trainer.eos_token_ids[0], exact) for i, t in zip(texts, ids)}
        self.checked: set[int] = set()
        self.dropped = 0  # references that did not earn the reward
        self.screen: ReferenceScreen | None = None

    def refresh(self) -> None:
        """Score the prompts the screen wants (checking their references first)."""
        screen = self.screen
        assert screen is not None, "attach the screen first"
        wanted = screen.wanted()
        fresh = [p for p in wanted if p.prompt_id not in self.checked]
        if fresh:
            self._check(fresh)
            wanted = [p for p in wanted if p.prompt_id in screen.references]
        if wanted:
            logprobs, tokens = self._score(wanted)
            screen.update(logprobs, tokens)

    def _check(self, prompts: Sequence[Prompt]) -> None:
        """Drop the references (of ``prompts``) that do not earn the reward."""
        trainer = self.trainer
        acc = trainer.accelerator
        ids = [p.prompt_id for p in prompts]
        mine = rank_share(ids, acc.num_processes, acc.process_index)
        inputs = [dict(trainer.train_dataset[i]) for i in mine]
        prompt_texts = [x["prompt"] for x in inputs]
        conversational = isinstance(prompt_texts[0], list)
        completions = [
            [{"role": "assistant", "content": self.texts[i]}] if conversational else self.texts[i] for i in mine
        ]
        with _quiet(trainer):
            rewards = (
                trainer._calculate_rewards(inputs, prompt_texts, completions, [list(self.references[i]) for i in mine])
                .cpu()
                .tolist()
            )
        weights = [float(w) for w in trainer.reward_weights]
        threshold = trainer.args.gate_success_threshold
        for pid, r in zip(ids, rewards):
            self.checked.add(pid)
            if not scalar_reward(r, weights) > threshold:
                self.screen.references.pop(pid, None)
                self.dropped += 1
        if self.dropped and self.dropped == len(self.checked):
            logger.warning(
                "none of the %d references of column %r checked so far earns the reward (above "
                "gate_success_threshold=%s); the reference prior has nothing to score. Point "
                "gate_reference_column at completions the reward accepts.",
                self.dropped,
                self.column,
                threshold,
            )

    def _score(self, prompts: Sequence[Prompt]) -> tuple[dict[int, float], int]:
        """The policy's summed log-probability of each prompt's reference, and the tokens scored."""
        trainer = self.trainer
        acc = trainer.accelerator
        ids = [p.prompt_id for p in prompts]
        mine = rank_share(ids, acc.num_processes, acc.process_index)
        prompt_ids, _, _ = trainer._tokenize_prompts([trainer.train_dataset[i]["prompt"] for i in mine])
        refs = [self.references[i] for i in mine]
        device = acc.device
        prompt_t = pad(
            [torch.tensor(p) for p in prompt_ids], padding_value=trainer._tokenizer.pad_token_id, padding_side="left"
        )
        prompt_m = pad([torch.ones(len(p), dtype=torch.long) for p in prompt_ids], padding_value=0, padding_side="left")
        ref_t = pad(
            [torch.tensor(r) for r in refs], padding_value=trainer._tokenizer.pad_token_id, padding_side="right"
        )
        ref_m = pad([torch.ones(len(r), dtype=torch.long) for r in refs], padding_value=0, padding_side="right")
        input_ids = torch.cat([prompt_t, ref_t], dim=1).to(device)
        mask = torch.cat([prompt_m, ref_m], dim=1).to(device)
        model = trainer.model
        training = model.training
        model.eval()  # the policy's own probabilities (no dropout), as sampling sees them
        try:
            with torch.no_grad():
                logps, _, _ = trainer._get_per_token_logps_and_entropies(
                    model, input_ids, mask, ref_t.size(1), batch_size=trainer.args.per_device_train_batch_size
                )
        finally:
            model.train(training)
        sums = (logps.float().cpu() * ref_m).sum(dim=1).tolist()
        scored = gather_all(list(zip(mine, sums)))[: len(ids)]
        tokens = sum(len(p) for p in prompt_ids) + sum(len(r) for r in refs)
        return {int(i): float(lp) for i, lp in scored}, int(sum(gather_all([tokens])))


@contextmanager
def _quiet(trainer: Any) -> Iterator[None]:
    """Reward functions' ``log_extra`` and ``log_metric`` calls on references do not reach TRL's logs."""
    extra = {k: list(v) for k, v in trainer._pending_extra_logs.items()}
    metrics = {k: list(v) for k, v in trainer._pending_metrics.items()}
    try:
        yield
    finally:
        trainer._pending_extra_logs.clear()
        trainer._pending_extra_logs.update(extra)
        trainer._pending_metrics.clear()
        trainer._pending_metrics.update(metrics)
