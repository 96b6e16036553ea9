"""The simulator, driven through the real orchestrator, reproduces the closed forms (docs/methods.md, SARA) of
SARA's "abandon iff the k-probe is all-same" rule at a fixed success rate p."""

from __future__ import annotations

import math

import pytest
from run_helpers import run_components

from controller.posterior import sara_expected_rollouts, sara_false_abandonment
from railgate.bench.probe import GateProbe
from railgate.build import build_components
from railgate.config import load_config


def run_sara(p: float, launch: str, prompts: int = 3000):
    difficulty = -math.log(p / (1 - p))  # every prompt has success probability exactly p
    cfg = load_config(
        None,
        [
            "gate.kind=sara",
            f"gate.sara.launch={launch}",
            "gate.sara.probe_size=4",
            "sim.num_prompts=4096",
            "sim.num_eval_prompts=8",
            "sim.learning_rate=0",
            "sim.prompt_learning_rate=0",
            f"sim.difficulty=[{{weight: 1.0, mean: {difficulty}, std: 0.0}}]",
            "orchestrator.group_size=8",
            "orchestrator.batch_groups=64",
            "orchestrator.max_tokens=4096",
            "orchestrator.steps=100000",
            f"orchestrator.max_rollouts={prompts * 7}",
            "orchestrator.eval_every=0",
        ],
    )
    comps = build_components(cfg)
    probe = GateProbe(comps.gate, comps.engine.world, comps.engine)
    summary = run_components(comps, cfg, seed=11, gate=probe)
    return summary.budget, probe


@pytest.mark.slow
@pytest.mark.parametrize("p", [0.3, 0.85])
def test_probe_first_sara_matches_closed_forms(p):
    budget, probe = run_sara(p, "probe_first")
    # Groups still open at the end (probing, or committed and finishing) are not decided yet.
    decided = budget.groups_committed + budget.groups_abandoned
    per_prompt = (budget.rollouts_started - 8 * (budget.groups_opened - decided)) / decided
    expected = sara_expected_rollouts(p, 4, 8)
    n = decided
    sd = 4 * math.sqrt((1 - p**4 - (1 - p) ** 4) * (p**4 + (1 - p) ** 4))
    assert abs(per_prompt - expected) < 4 * sd / math.sqrt(n) + 0.02, (per_prompt, expected)
    false_rate = probe.false_abandonment_sum / decided
    expected_false = sara_false_abandonment(p, 4, 8)
    assert abs(false_rate - expected_false) < 4 * math.sqrt(expected_false / n) + 0.005, (false_rate, expected_false)
