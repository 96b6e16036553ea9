"""OracleGate: what it knows (exact p), what it pays (G per opened group), when it gives up."""

from __future__ import annotations

from pathlib import Path

import pytest
from gate_harness import GateHarness, HarnessConfig
from gate_units import admit, pool_of

from controller.gates.oracle import OracleGate


def test_never_opens_prompts_it_knows_are_saturated():
    p = {i: [0.0, 1.0, 0.5][i % 3] for i in range(30)}
    gate = OracleGate(pool_of(30), 8, p.__getitem__, seed=0)
    opened = [plan.prompt.prompt_id for _ in range(10) for plan in admit(gate, 3, step=0)]
    assert opened and all(p[i] == 0.5 for i in opened)
    assert gate.metrics()["gate/skip"] >= 2 * len(opened) - 5


def test_opens_a_prompt_with_the_probability_its_group_is_mixed():
    p = {0: 0.05}
    gate = OracleGate(pool_of(1), 8, p.__getitem__, seed=0)
    trials = 4000
    opened = sum(len(admit(gate, 1, step=0)) for _ in range(trials))
    mixed = 1 - 0.95**8 - 0.05**8
    assert abs(opened / trials - mixed) < 4 * (mixed * (1 - mixed) / trials) ** 0.5


def test_pays_exactly_g_per_group_and_nothing_for_skips():
    p = {i: [0.0, 0.3, 1.0, 0.7][i % 4] for i in range(200)}
    gate = OracleGate(pool_of(200), 8, p.__getitem__, seed=0)
    harness = GateHarness(gate, p, HarnessConfig(batch_groups=8, steps=5)).run()
    harness.check_invariants()
    assert harness.stats["rollouts"] == 8 * harness.stats["opened"]
    trained = [g for b in harness.batch_log for g in b.groups]
    assert {g.prompt_id % 4 for g in trained} <= {1, 3}


def test_all_saturated_pool_is_exhausted():
    p = {i: float(i % 2) for i in range(10)}
    gate = OracleGate(pool_of(10), 8, p.__getitem__, seed=0)
    assert admit(gate, 4, step=0) == [] and gate.exhausted
    harness = GateHarness(OracleGate(pool_of(10), 8, p.__getitem__, seed=0), p, HarnessConfig(batch_groups=2)).run()
    assert harness.stop_reason == "stalled"


def test_needs_the_success_probability():
    with pytest.raises(TypeError, match="success_probability"):
        OracleGate(pool_of(3), 8, 0.5, seed=0)  # type: ignore[arg-type]


def test_hindsight_mode_trains_only_mixed_groups_and_books_saturated_ones_as_uncounted():
    p = {i: [0.0, 0.3, 1.0, 0.7][i % 4] for i in range(200)}
    gate = OracleGate(pool_of(200), 8, None, seed=0)
    harness = GateHarness(gate, p, HarnessConfig(batch_groups=8, steps=5)).run()
    harness.check_invariants()
    trained = [g for b in harness.batch_log for g in b.groups]
    assert trained and all(0 < sum(r.reward > 0 for r in g.rollouts) < 8 for g in trained)
    m = gate.metrics()
    # Every opened group costs 8; what was not trained on is exactly the uncounted part.
    assert harness.stats["rollouts"] == 8 * harness.stats["opened"]
    assert m["gate/uncounted_rollouts"] > 0
    assert m["gate/uncounted_rollouts"] % 8 == 0
    assert {g.prompt_id % 4 for g in trained} <= {1, 3}


def test_the_rollout_budget_does_not_count_the_oracles_uncounted_rollouts():
    from run_helpers import run_components

    from railgate.build import build_components
    from railgate.config import load_config

    sim_yaml = Path(__file__).resolve().parents[1] / "configs" / "sim.yaml"
    cfg = load_config(
        sim_yaml,
        [
            "gate.kind=oracle",
            "orchestrator.max_rollouts=2000",
            "orchestrator.steps=1000",
            "orchestrator.batch_groups=8",
            "sim.num_prompts=512",
            "sim.num_eval_prompts=64",
        ],
    )
    comps = build_components(cfg, progress=False)
    summary = run_components(comps, cfg, seed=0)
    counted = summary.budget.rollouts_started - comps.gate.uncounted_rollouts
    assert comps.gate.uncounted_rollouts > 0
    assert 2000 <= counted < 2000 + 8 * 8 * 3  # stops within the batches in flight past the budget
    assert "budget" in summary.stop_reason
