"""A GatedGRPOTrainer run for ``accelerate launch`` on CPU (tests/test_trl_multiprocess.py).

    accelerate launch --multi_gpu --num_processes N tests/trl_launch.py SCENARIO OUT MODEL_DIR

On a machine without CUDA, ``--multi_gpu`` starts N processes through torchrun and the
config's ``use_cpu=True`` makes them one gloo group (``accelerate launch --cpu --num_processes
N`` starts a single process unless an MPI hostfile is given; docs/trl.md).

Scenarios (the global batch is the same for any N: 4 prompts x 4 completions a step):

* ``hora``: HORA on prompts whose reward is fixed by the prompt (easy 1, hard 0), so its
  allocation is a function of the gathered probes alone -- the same for 1 and 2 processes;
* ``split``: SARA (probing every prompt) with a reward of 1 on process 0 and 0 on process 1, so a
  group is mixed only when its probe is split over the two processes (gathering is what makes it
  trainable);
* ``disagree``: like ``hora``, but process 1's dataset lacks a row, so its gate draws other
  prompts (the run must stop rather than train on groups the processes disagree about).

Each process writes OUT/rank-R.json: the groups of every step (prompt id, size) and the counts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accelerate import PartialState  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl_fixtures import CPU_RUN  # noqa: E402

from railgate.trl import GatedGRPOConfig, GatedGRPOTrainer  # noqa: E402


def fixed(prompts, completions, kind, **kwargs):
    return [1.0 if k == "easy" else 0.0 for k in kind]


def by_process(prompts, completions, **kwargs):
    return [1.0 if PartialState().process_index == 0 else 0.0] * len(completions)  # the state made in main


def main(scenario: str, out: Path, model: str) -> None:
    torch.set_num_threads(1)
    state = PartialState(cpu=True)  # before anything else makes the shared state: gloo on CPU
    processes = state.num_processes
    rows = [{"prompt": f"{i}*{i}=", "kind": "easy" if i % 3 == 0 else "hard"} for i in range(64)]
    if scenario == "disagree" and state.process_index == 1:
        rows = rows[:-1]  # a dataset of another length: the seeded prompt order differs
    kind = "sara" if scenario == "split" else "hora"
    prompts_per_step = 3 if scenario == "split" else 4
    args = GatedGRPOConfig(
        output_dir=str(out / "run"),
        num_generations=4,
        per_device_train_batch_size=4 * prompts_per_step // processes,
        max_completion_length=4,
        max_steps=3,
        **CPU_RUN,
        gate_kind=kind,
        gate_probe_size=2,
        gate_probe_when="always",  # probes always: the scenario is about a probe split over processes
        gate_hora_budget=14,
        gate_reference_prior=False,
        gate_step_rollouts=8,
    )
    trainer = GatedGRPOTrainer(
        model=model,
        reward_funcs=by_process if scenario == "split" else fixed,
        args=args,
        train_dataset=Dataset.from_list(rows),
    )
    steps = []
    next_batch = trainer.gate.driver.next_batch

    def recorded(sample):
        batch = next_batch(sample)
        steps.append([(g.prompt_id, len(g.rollouts), g.rewards) for g in batch.groups])
        return batch

    trainer.gate.driver.next_batch = recorded
    trainer.train()
    (out / f"rank-{state.process_index}.json").write_text(
        json.dumps({"steps": steps, "metrics": trainer.gate.metrics()})
    )


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
