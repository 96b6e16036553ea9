"""``gate_mode="shadow"``: a ``GatedGRPOTrainer`` that trains as ``GRPOTrainer`` and logs what the gate would have done.

In shadow mode the trainer runs TRL's own ``_generate_and_score_completions`` on TRL's own
prompts (no ``GateSession``, no gating, no random draws of its own), so its weights and losses
are ``GRPOTrainer``'s. ``ShadowSession`` only watches: for each generation batch it takes the
completions TRL generated (``_generate``'s output on each rank) and the rewards TRL computed
(``_calculate_rewards``' output, already gathered over ranks), gathers the rows to every rank
and, on the main process,

* writes the batch's full groups to ``output_dir/railgate_groups/`` (a group log,
  ``pipeline.store.grouplog``; one write per generation batch): prompt text (a chat prompt's last
  message), ``prompt_id`` = the prompt's first row in the train dataset, completion ids and text,
  lengths, each row's total reward -- the reward functions' outputs weighted by TRL's
  ``reward_weights`` and summed, as TRL sums them (a row no function scored is recorded as 0) --
  ``finish_reason`` ("length" when the completion does not end in EOS or pad, TRL's own test),
  ``step`` and ``policy_version`` = TRL's global step when the batch was generated,
  ``finish_order`` = the row's index in its group (TRL does not keep the order completions
  finished in), ``reference_logprob`` null (scoring the reference would run the model outside
  TRL's step), ``success_threshold`` = ``gate_success_threshold``;
* replays the configured gate (``gate_kind`` and the ``gate_*`` settings, mapped as
  ``GateSession`` maps them, reference prior off) on the batch's groups: one replay per batch, a
  fresh gate, order seed 0 (``railgate.shadow_gate``); its figures are logged as
  ``railgate/shadow_NAME`` (the latest batch; ``railgate/shadow_step`` says which) and
  ``railgate/shadow_total_NAME`` (the run so far).

``python run.py bench replay OUTPUT_DIR/railgate_groups --per-step`` recomputes them exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pipeline.config.sections import EngineConfig
from pipeline.store.grouplog import GroupLogWriter, RecordedGroup, RecordedSample
from pipeline.types import FinishReason
from railgate.config import RunConfig
from railgate.shadow_gate import ShadowRule, ShadowTally, replayed_config
from railgate.trl.ranks import gather_all
from railgate.trl.session import _text, orchestrator_config

GROUPS_DIR = "railgate_groups"
"""Where in ``output_dir`` a shadow run writes its group log."""


def shadow_run_config(args: Any) -> RunConfig:
    """railgate's ``RunConfig`` of a ``GatedGRPOConfig``'s gate: ``gate_config`` (the ``gate_*``
    fields, as ``GateSession`` maps them) with the tracker limits ``GateSession`` uses, seeded from
    ``args.seed``; the engine is model-free (a replay runs none)."""
    return RunConfig(
        seed=args.seed,
        run_dir=str(args.output_dir),
        engine=EngineConfig(kind="sim"),
        orchestrator=orchestrator_config(args),
        gate=args.gate_config(reference_prior=False),
    )


class ShadowSession:
    """What a shadow-mode trainer keeps beside TRL (see the module docstring)."""

    def __init__(self, trainer: Any):
        args = trainer.args
        self.trainer = trainer
        self.group_size = args.num_generations
        self.threshold = args.gate_success_threshold
        self.rule = ShadowRule(replayed_config(shadow_run_config(args)))
        self.main = trainer.accelerator.is_main_process
        self.directory = Path(args.output_dir) / GROUPS_DIR
        first: dict[str, int] = {}
        for i, row in enumerate(trainer.train_dataset.select_columns(["prompt"])):
            first.setdefault(_text(row["prompt"]), i)
        self.prompt_ids = first
        self.run_id = args.run_name or Path(args.output_dir).name
        self.writer: GroupLogWriter | None = None  # opened at the first batch (again after a close)
        if self.main:
            self.rule.save(self.directory)
        self.tally = ShadowTally()
        self.latest: dict[str, float] = {}
        self.rollouts_generated = 0
        self.unscored = 0
        self._generated: tuple | None = None
        self._rewards: torch.Tensor | None = None

    # --- what the trainer hands over during TRL's step ----------------------------------------

    def generated(self, output: tuple) -> None:
        """``_generate``'s output on this rank."""
        self._generated = output

    def rewarded(self, rewards_per_func: torch.Tensor) -> None:
        """``_calculate_rewards``' output (every rank's rows)."""
        self._rewards = rewards_per_func

    def record(self, inputs: list[dict[str, Any]]) -> None:
        """The generation batch TRL just generated and scored: gathered, written and replayed."""
        generated, rewards = self._generated, self._rewards
        self._generated = self._rewards = None
        if generated is None or rewards is None:
            raise RuntimeError("gate_mode='shadow' saw no generation or rewards in TRL's step; report this")
        completion_ids, completions = generated[1], generated[3]
        local = [
            (_text(x["prompt"]), list(map(int, ids)), _text(c))
            for x, ids, c in zip(inputs, completion_ids, completions)
        ]
        rows = gather_all(local)
        trainer = self.trainer
        weights = trainer.reward_weights.to(rewards.device).unsqueeze(0)
        unscored = torch.isnan(rewards).all(dim=1)
        totals = (rewards * weights).nansum(dim=1)
        self.unscored += int(unscored.sum())
        totals = [float(v) for v in totals.cpu()]
        if len(rows) != len(totals) or len(rows) % self.group_size:
            raise RuntimeError(
                f"gate_mode='shadow': {len(rows)} rows and {len(totals)} rewards in a generation batch, not whole "
                f"groups of {self.group_size}; report this"
            )
        self.rollouts_generated += len(rows)
        if not self.main:
            return
        step = int(trainer.state.global_step)
        stops = {*trainer.eos_token_ids, getattr(trainer, "_tokenizer", trainer.processing_class).pad_token_id}
        groups = []
        k, per_step = self.group_size, len(rows) // self.group_size
        for g in range(per_step):
            block = rows[g * k : (g + 1) * k]
            samples = tuple(
                RecordedSample(
                    index=i,
                    reward=totals[g * k + i],
                    num_tokens=len(ids),
                    finish_order=i,
                    token_ids=tuple(ids),
                    text=text,
                    finish_reason=FinishReason.LENGTH if ids and ids[-1] not in stops else FinishReason.STOP,
                    policy_version=step,
                )
                for i, (_, ids, text) in enumerate(block)
            )
            prompt = block[0][0]
            groups.append(
                RecordedGroup(
                    group_id=step * per_step + g,
                    prompt_id=self.prompt_ids.get(prompt, -1),
                    samples=samples,
                    step=step,
                    prompt_text=prompt,
                    success_threshold=self.threshold,
                )
            )
        if self.writer is None:
            self.writer = GroupLogWriter(self.directory, run_id=self.run_id)
        self.writer.write(groups)
        figures = self.rule.figures(groups)
        latest = {"step": float(step), **figures, **self.tally.add(figures)}
        self.latest = {f"railgate/shadow_{name}": value for name, value in latest.items()}

    # --- what the logs and the callbacks read ----------------------------------------------

    def metrics(self) -> dict[str, float]:
        """``railgate/shadow_*`` of the latest generation batch and the run so far (main process)."""
        out = dict(self.latest)
        if out:
            out["railgate/shadow_unscored_rows"] = float(self.unscored)
        return out

    def flush(self) -> None:
        """Nothing buffered: every batch is written when generated."""

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
