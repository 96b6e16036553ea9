"""trl-cgrpo's ``CGRPOTrainer`` as a third trainer of ``bench trl``, run in its own environment.

trl-cgrpo 0.2 requires TRL < 1.15 and railgate's ``trl`` extra pins TRL 1.16, so the two cannot
share a Python environment. ``bench trl --peer-python PY`` runs this module with the interpreter
``PY`` of an environment that holds railgate (without its ``trl`` extra) and trl-cgrpo:

    python -m venv peer && peer/bin/pip install -e '.[cgrpo-peer]'
    python run.py bench trl --model cpu --peer-python peer/bin/python

For each seed, after GRPOTrainer and GatedGRPOTrainer, the bench calls
``PY -m railgate.bench.trl_peer REQUEST.json``. This module trains C-GRPO on the same model,
dataset (in the seed's ``paired_order``, less its calibration rows), reward, seed and matched settings (``railgate.bench.trl.matched_args``), evaluates it
with the same held-out draws, and writes the run record beside the request. Its rollouts are every
completion the policy generated: the adaptive groups' draws (C-GRPO's one-token padding rows are
not generated and not counted) and its calibration draws (``num_calibration_samples`` x
``max(budget_grid)`` at each calibration), which count against the same budget because the policy
generated them; they are also reported apart, as ``cgrpo/calibration_rollouts``.

Settings (``PeerSettings``): budget grid 2, 4, 8 (the group is 8 wide, as for the other two), the
calibration set = held-out-free training rows set aside (never trained on), recalibration every
50 steps, ``delta`` chosen by C-GRPO from the solve rate (its default).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PeerSettings:
    """C-GRPO's own settings in ``bench trl``."""

    budget_grid: tuple[int, ...] = (2, 4, 8)
    """Sampling budgets; the last is the group width (``--group-size``)."""
    calibration_prompts: int = 64
    """Training rows set aside (not trained on) to fit the conformal thresholds."""
    recalibrate_every: int = 50
    """Optimiser steps between calibrations."""


def run_cgrpo(seed: int, spec: Any, task: Any, model_dir: Path, root: Path, peer: PeerSettings = PeerSettings()):
    """Train C-GRPO on one seed until it has generated ``spec.budget`` rollouts; its run record."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl_cgrpo import CGRPOConfig, CGRPOTrainer

    from railgate.bench.trl import RunRecord, matched_args, paired_order
    from railgate.bench.trl_eval import Curve, HeldOut
    from railgate.bench.trl_steps import Steps

    if peer.budget_grid[-1] != spec.group_size:
        raise ValueError(f"the budget grid {peer.budget_grid} must end at --group-size={spec.group_size}")
    calibration = task.train_rows[-peer.calibration_prompts :]
    # the other trainers' order of the seed, less the calibration rows
    train = [r for r in paired_order(task.train_rows, seed) if r not in calibration]
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    held_out = HeldOut(
        task.eval_rows, task.reward, tokenizer, task.max_completion_length, samples=spec.eval_samples, seed=1000 + seed
    )
    step_rollouts = spec.prompts_per_step * spec.group_size
    args = CGRPOConfig(
        max_steps=10 * spec.budget // step_rollouts,  # the budget stops it first
        budget_grid=list(peer.budget_grid),
        recalibrate_every=peer.recalibrate_every,
        num_calibration_samples=len(calibration),
        **matched_args(spec, task, "cgrpo", seed, root),
    )

    class Counting(CGRPOTrainer):
        """Counts every completion the policy generates (training draws and calibration)."""

        rollouts = 0
        tokens = 0
        calibration_rollouts = 0

        def _base_generate(self, prompt_ids, *rest, **kwargs):
            ids, logprobs = super()._base_generate(prompt_ids, *rest, **kwargs)
            self.rollouts += len(ids)
            self.tokens += sum(len(p) for p in prompt_ids) + sum(len(c) for c in ids)
            return ids, logprobs

        def calibrate(self):
            before = self.rollouts
            try:
                return super().calibrate()
            finally:
                self.calibration_rollouts += self.rollouts - before

    run = Counting(
        model=str(model_dir),
        reward_funcs=task.reward,
        args=args,
        train_dataset=Dataset.from_list(train),
        calibration_dataset=Dataset.from_list(calibration),
        answer_extractor=task.extract_answer,
        processing_class=tokenizer,
    )

    def generated() -> tuple[int, int]:
        return run.rollouts, run.tokens

    class Budget(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if run.rollouts >= spec.budget:
                control.should_training_stop = True
            return control

    curve = Curve(held_out, spec.eval_every, generated)
    steps = Steps(generated)  # C-GRPO's groups vary in size: no count of mixed groups
    run.add_callback(curve)
    run.add_callback(steps)
    run.add_callback(Budget())
    wall = time.time()
    run.train()
    wall = time.time() - wall
    mean_k = [float(x["cgrpo/mean_k"]) for x in run.state.log_history if "cgrpo/mean_k" in x]
    return RunRecord(
        "cgrpo",
        seed,
        curve.points,
        run.rollouts,
        run.tokens,
        curve.training_cpu_s(),
        wall,
        curve.eval_cpu_s,
        int(run.state.global_step),
        {
            "cgrpo/mean_k": sum(mean_k) / len(mean_k) if mean_k else float("nan"),
            "cgrpo/calibration_rollouts": float(run.calibration_rollouts),
        },
        steps.logs,
    )


def main(request_path: str) -> int:
    """Run the request the bench wrote (spec, seed, model directory) and write the record beside it."""
    import torch

    from railgate.bench.trl import TrlBenchSpec, model_and_task

    request = json.loads(Path(request_path).read_text())
    spec = TrlBenchSpec(**request["spec"])
    torch.set_num_threads(spec.threads)
    root = Path(request["root"])
    model_dir, task = model_and_task(spec, root, progress=False)
    record = run_cgrpo(int(request["seed"]), spec, task, model_dir, root)
    out = Path(request_path).with_suffix(".record.json")
    out.write_text(json.dumps(asdict(record), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
