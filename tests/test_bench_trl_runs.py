"""bench trl's runs: the trainers of a seed draw the same prompts in the same order."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from trl_fixtures import model_dir  # noqa: E402

from railgate.bench.trl import TrlBenchSpec, build_trainer  # noqa: E402
from railgate.bench.trl_tasks import TrlTask, last_number_reward  # noqa: E402


def tiny_task(n: int = 24) -> TrlTask:
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i), "reference": str(2 * i)} for i in range(n)]
    return TrlTask("tiny", rows, rows[:2], last_number_reward, 4, reference_exact=False, reference_skip=0.45)


SPEC = TrlBenchSpec(budget=64, prompts_per_step=2, group_size=4, eval_every=32)


def first_prompts(trainer: str, seed: int, tmp_path, n: int = 12) -> list[str]:
    """The first ``n`` prompts the trainer would generate for, read off its sampler without training."""
    run, _ = build_trainer(trainer, seed, SPEC, tiny_task(), model_dir(tmp_path), tmp_path)
    if trainer == "grpo":  # TRL's RepeatSampler gives each prompt num_generations times in a row
        indices = list(run._get_train_sampler())[:: SPEC.group_size][:n]
    else:  # the gate's PromptPool: what it opens next, in order
        indices = [p.prompt_id for p in run.gate.pool.peek(n)]
    return [run.train_dataset[i]["prompt"] for i in indices]


def test_both_trainers_of_a_seed_draw_the_same_prompts_in_the_same_order(tmp_path):
    grpo, gated = first_prompts("grpo", 3, tmp_path), first_prompts("gated", 3, tmp_path)
    assert grpo == gated
    assert grpo != [f"{i}+{i}=" for i in range(12)]  # shuffled by the seed, not the task's order
    assert first_prompts("grpo", 4, tmp_path) != grpo  # and each seed has its own order
