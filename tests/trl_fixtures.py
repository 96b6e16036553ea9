"""What the TRL tests share: a tiny Llama directory, prompt datasets with known outcomes, TRL-style
reward functions, and matched settings for ``GRPOConfig`` / ``GatedGRPOConfig`` (fp32, no
gradient checkpointing, CPU, no reporting, no checkpoints)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hf_models import save_tiny_llama

CPU_RUN = dict(
    logging_steps=1,
    report_to=[],
    bf16=False,
    gradient_checkpointing=False,
    use_cpu=True,
    seed=0,
    save_strategy="no",
    disable_tqdm=True,
)
"""How every TRL test trains: fp32 on the CPU, seed 0, no gradient checkpointing, logging every
step, no reporting, no checkpoints, no progress bars."""
MATCHED = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=6,
    learning_rate=1e-3,
    max_steps=3,
    **CPU_RUN,
)
"""Settings both trainers of a test share (8 rows a step: 2 prompts x 4 completions)."""


def model_dir(root: Path) -> str:
    """A tiny random Llama with a BPE tokenizer, saved under ``root``."""
    path = root / "llama"
    if not (path / "config.json").exists():
        save_tiny_llama(path)
    return str(path)


def arithmetic_rows(n: int) -> list[dict[str, Any]]:
    """``n`` prompts ``a+b=`` with their answers."""
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)][:n]


def outcome_rows(n: int) -> list[dict[str, Any]]:
    """Prompts whose reward is fixed by their ``kind``: ``easy`` always 1, ``hard`` always 0,
    ``coin`` 1 for completions of even length (mixed groups are likely)."""
    kinds = ["easy", "hard", "coin"]
    return [{"prompt": f"{i}+{i}=", "kind": kinds[i % 3], "answer": str(2 * i)} for i in range(n)]


def by_kind(prompts, completions, kind, **kwargs):
    """The reward of ``outcome_rows``."""
    return [1.0 if k == "easy" else 0.0 if k == "hard" else float(len(c) % 2 == 0) for c, k in zip(completions, kind)]


def length_reward(prompts, completions, **kwargs):
    """A reward that varies with the completion: its length in characters, mod 3, and a bonus."""
    return [float(len(c) % 3 == 0) + 0.1 * len(c) for c in completions]


def plain_trainer(
    root: Path, name: str, rows: list[dict[str, Any]], reward: Any, settings: dict[str, Any], cls: Any = None
):
    """TRL's ``GRPOTrainer`` (or ``cls``, a subclass) on ``rows`` with ``GRPOConfig(**settings)``,
    writing under ``root / name``."""
    import trl
    from datasets import Dataset

    return (cls or trl.GRPOTrainer)(
        model=model_dir(root),
        reward_funcs=reward,
        train_dataset=Dataset.from_list(rows),
        args=trl.GRPOConfig(output_dir=str(root / name), **settings),
    )
