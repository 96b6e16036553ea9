"""GatedGRPOTrainer with its defaults (``gate_probe_when="pays"``) on prompts of known pass rates:
the reward ignores the completion and pays 1 with the prompt's ``rate``. Where every prompt has the
same middling rate, probing cannot pay and the gate trains on (almost) every rollout it generates;
where half the prompts are never solved and a probe abandons few mixed groups, it probes and
spends well under half on those."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl_fixtures import MATCHED, model_dir  # noqa: E402

from railgate.trl import GatedGRPOConfig, GatedGRPOTrainer  # noqa: E402


class RateReward:
    """1 with the prompt's ``rate``, whatever the completion; counts the completions of each rate."""

    __name__ = "rate_reward"

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.generated: dict[float, int] = {}

    def __call__(self, prompts, completions, rate, **kwargs):
        for r in rate:
            self.generated[r] = self.generated.get(r, 0) + 1
        return [float(self.rng.random() < r) for r in rate]


def run(tmp_path, rates, num_generations, steps, **gate):
    rows = [{"prompt": f"{i}+{i}=", "rate": rates[i % len(rates)]} for i in range(400)]
    reward = RateReward()
    args = GatedGRPOConfig(
        output_dir=str(tmp_path / "gated"),
        **{
            **MATCHED,
            "num_generations": num_generations,
            "per_device_train_batch_size": 8 * num_generations,
            "max_steps": steps,
            **gate,
        },
    )
    trainer = GatedGRPOTrainer(
        model=model_dir(tmp_path), reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows)
    )
    trainer.train()
    return trainer.gate.metrics(), reward


@pytest.mark.parametrize("num_generations", [4, 8])
def test_equal_middling_rates_generate_at_most_two_percent_more_than_they_train(tmp_path, num_generations):
    steps = 40 if num_generations == 4 else 20
    m, _ = run(tmp_path, [0.5], num_generations, steps)
    assert m["railgate/rollouts_trained"] == steps * 8 * num_generations
    assert m["railgate/rollouts_generated"] <= 1.02 * m["railgate/rollouts_trained"], m
    # Whole groups: the fitted prior settles the verdict (launched_whole) or probing does not pay.
    whole = m.get("railgate/gate/launched_whole", 0.0) + m["railgate/gate/probing_whole"]
    assert whole > 3 * m["railgate/gate/probing_probe"], m


def test_prompts_never_solved_get_well_under_half_the_rollouts(tmp_path):
    # a probe of 4 abandons about 2 in 17 mixed rate-0.5 groups: allowed at a cap of 20%, not at
    # the default 10% (tests/test_probing.py has both sides on the gate itself)
    m, reward = run(tmp_path, [0.0, 0.5], 8, 20, gate_probe_max_lost=0.2)
    assert sum(reward.generated.values()) == m["railgate/rollouts_generated"]
    assert reward.generated[0.0] < 0.4 * m["railgate/rollouts_generated"], reward.generated
