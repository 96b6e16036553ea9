"""``GatedGRPOTrainer``: TRL's ``GRPOTrainer`` whose generation batches the gate fills.

What changes against ``GRPOTrainer``, and only this: where TRL generates a batch of
``prompts x num_generations`` completions for the prompts its sampler drew, the gate picks the
prompts, probes each, and generates the rest of a group only for the prompts it commits
(``railgate.trl.session``); the batch it hands on holds exactly the committed groups, in
TRL's layout. Everything after generation is TRL's own code run on that batch -- rewards
(``_calculate_rewards`` returns the rewards already computed for the gate), advantages, the
reference model, importance sampling, the loss, logging -- so for the groups that train the
loss is exactly TRL's (tests/test_trl_trainer.py: with a gate that commits everything, the
loss and the weights match a plain ``GRPOTrainer``'s step for step). TRL's own sampler still
runs and sets the number of steps; its prompts are not used.

With ``gate_mode="shadow"`` nothing of this happens: generation, rewards and the loss are TRL's
own, and ``railgate.trl.shadow`` only records each generation batch and logs what the gate
would have done with it (``railgate/shadow_*``).

Evaluation (``eval_dataset``) is TRL's, ungated. The counts of what was generated are logged
as ``railgate/*`` through TRL's logger, beside its own metrics, and so is the gradient noise
scale of the optimiser steps (``railgate.trl.noise``), which ``gate_probe_price_steps`` feeds to
SARA's probing rule.

>>> import inspect
>>> [name for name, _ in inspect.getmembers(GatedGRPOTrainer, inspect.isfunction)
...  if name in vars(GatedGRPOTrainer) and not name.startswith("__")]
['_calculate_rewards', '_generate', '_generate_and_score_completions', 'log']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from railgate.trl.checks import check_arguments, check_processor
from railgate.trl.noise import MeasuresNoise
from railgate.trl.rows import Row, local_share
from railgate.trl.session import GateSession
from railgate.trl.shadow import ShadowSession


@dataclass(frozen=True)
class _Served:
    """A gated batch handed to TRL: the local rows, as ``_generate`` returns them, and the
    global rewards, as ``_calculate_rewards`` returns them."""

    generated: tuple
    rewards: torch.Tensor


class GatedGRPOTrainer(MeasuresNoise, GRPOTrainer):
    """``GRPOTrainer`` with railgate's gate deciding which groups are generated and trained.

    Takes exactly ``GRPOTrainer``'s arguments; ``args`` must be a ``GatedGRPOConfig``. Settings
    the gate cannot run (tools, environments, a custom rollout function, images, an iterable
    dataset) fail here, naming the setting (``railgate.trl.checks``).

    Examples
    --------
    A character-level GPT-2 from scratch, a TRL reward function, two steps:

    >>> import contextlib, io, tempfile, torch
    >>> from datasets import Dataset
    >>> from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    >>> from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    >>> from railgate.trl import GatedGRPOConfig
    >>> vocab = {c: i for i, c in enumerate(["<pad>", "<eos>", *"0123456789+="])}
    >>> core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    >>> core.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    >>> tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")
    >>> _ = torch.manual_seed(0)
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=len(vocab), n_embd=32, n_layer=1, n_head=2, eos_token_id=1,
    ...                                    pad_token_id=0, bos_token_id=None))
    >>> def exact(completions, answer, **kwargs):
    ...     return [float(c == a) for c, a in zip(completions, answer)]
    >>> data = Dataset.from_list([{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(5) for b in range(5)])
    >>> args = GatedGRPOConfig(output_dir=tempfile.mkdtemp(), num_generations=4, gate_probe_size=2,
    ...                        per_device_train_batch_size=8, max_completion_length=3, max_steps=2, use_cpu=True,
    ...                        report_to=[], disable_tqdm=True)
    >>> trainer = GatedGRPOTrainer(model=model, reward_funcs=exact, args=args, train_dataset=data, processing_class=tok)
    >>> with contextlib.redirect_stdout(io.StringIO()):   # TRL prints its logs
    ...     result = trainer.train()
    >>> result.global_step
    2
    >>> m = trainer.gate.metrics()       # what the gate generated, and how TRL's fixed batches were filled
    >>> m["railgate/rollouts_trained"] + m["railgate/pad_rows"], m["railgate/rollouts_generated"] >= 8
    (16.0, True)
    """

    def __init__(self, *args: Any, **kwargs: Any):
        check_arguments(args, kwargs)
        super().__init__(*args, **kwargs)
        check_processor(self)
        self._served: _Served | None = None
        self._shadowing = False
        self.gate: GateSession | ShadowSession
        self.gate = ShadowSession(self) if self.args.gate_mode == "shadow" else GateSession(self)
        self.add_callback(_GateCallback(self.gate))

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)  # evaluation: TRL's, ungated
        if isinstance(self.gate, ShadowSession):  # TRL's own step; the session only watches
            self._shadowing = True
            try:
                out = super()._generate_and_score_completions(inputs)
            finally:
                self._shadowing = False
            self.gate.record(inputs)
            return out
        acc = self.accelerator
        rows = self.gate.next_rows()
        local = local_share(rows, acc.process_index, acc.num_processes)
        self._served = _serve(local, rows, acc.device)
        for column in {c for r in local for c, _ in r.extras}:  # what the reward functions logged for these rows
            self._pending_extra_logs[column].extend(dict(r.extras).get(column) for r in local)
        try:
            return super()._generate_and_score_completions([dict(self.train_dataset[r.index]) for r in local])
        finally:
            self._served = None

    def _generate(self, prompts: list) -> tuple:
        served = self._served
        if served is None:
            out = super()._generate(prompts)
            if self._shadowing:
                self.gate.generated(out)  # type: ignore[union-attr]
            return out
        if len(prompts) != len(served.generated[0]):
            raise RuntimeError(
                f"TRL asked for {len(prompts)} completions of a gated batch of {len(served.generated[0])}"
            )
        return served.generated

    def _calculate_rewards(
        self, inputs: list, prompts: list, completions: list, completion_ids_list: list
    ) -> torch.Tensor:
        if self._served is None:
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            if self._shadowing:
                self.gate.rewarded(rewards)  # type: ignore[union-attr]
            return rewards
        return self._served.rewards

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training and not any(k.startswith("eval_") for k in logs):
            logs.update(self.gate.metrics())
        super().log(logs, start_time)


def _serve(local: list[Row], rows: list[Row], device: torch.device) -> _Served:
    """What TRL's ``_generate`` (for the local rows) and ``_calculate_rewards`` (for all rows,
    gathered) would have returned for this batch."""
    logprobs = None if any(r.logprobs is None for r in local) else [list(r.logprobs) for r in local]
    generated = (
        [list(r.prompt_ids) for r in local],
        [list(r.completion_ids) for r in local],
        None,
        [r.completion for r in local],
        logprobs,
        {},
        None,
        [],
    )
    rewards = torch.tensor([r.rewards for r in rows], dtype=torch.float32, device=device)
    return _Served(generated, rewards)


class _GateCallback(TrainerCallback):
    """Stops training at ``gate_max_rollouts`` generated rollouts; writes the trace at saves and at the end."""

    def __init__(self, session: GateSession | ShadowSession):
        self.session = session

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if args.gate_max_rollouts and self.session.rollouts_generated >= args.gate_max_rollouts:
            control.should_training_stop = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.session.flush()
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.session.flush()
        if isinstance(self.session, ShadowSession):
            self.session.close()
        return control
