"""What a run pays for: a gate that never abandons opens no group that no step trains on, and
the report states the rollouts started that no step trained on for the gates that do abandon."""

from __future__ import annotations

import anyio
import pytest

from railgate.build import build_components, build_orchestrator
from railgate.config import load_config
from railgate.report import summary_table

SIM = [
    "orchestrator.batch_groups=8",
    "orchestrator.group_size=4",
    "sim.num_prompts=256",
    "sim.num_eval_prompts=32",
    "log.tensorboard=false",
]
TORCH = [
    "model.d_model=32",
    "model.n_layers=1",
    "model.warm_start_steps=2",
    "model.warm_start_target=0",
    "orchestrator.batch_groups=4",
    "orchestrator.group_size=4",
    "data.num_train_prompts=64",
    "data.num_eval_prompts=8",
    "gate.sara.reference_prior=false",
    "orchestrator.max_rollouts=0",
]


def run(config: str, overrides: list[str]):
    cfg = load_config(config, overrides)
    parts = build_components(cfg, progress=False)
    try:
        return cfg, anyio.run(build_orchestrator(cfg, parts).run)
    finally:
        anyio.run(parts.engine.aclose)


@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize("step_kind", ["orchestrator.batch_rollouts=0", "orchestrator.batch_rollouts=auto"])
def test_a_uniform_sim_run_starts_exactly_the_rollouts_it_trains_on(tmp_path, steps, step_kind):
    cfg, summary = run(
        "configs/sim.yaml", SIM + [f"orchestrator.steps={steps}", "gate.kind=uniform", step_kind, f"run_dir={tmp_path}"]
    )
    o = cfg.orchestrator
    metrics = summary.budget.as_metrics()
    assert metrics["pipeline/rollouts_started"] == steps * o.batch_groups * o.group_size
    assert metrics["pipeline/rollouts_trained"] == metrics["pipeline/rollouts_started"]
    assert metrics["pipeline/rollouts_untrained"] == 0 and metrics["pipeline/groups_opened"] == steps * o.batch_groups


@pytest.mark.parametrize("steps", [1, 2])
def test_a_uniform_run_of_the_default_config_starts_exactly_steps_x_groups_x_group_size(tmp_path, steps):
    cfg, summary = run(
        "configs/default.yaml", TORCH + [f"orchestrator.steps={steps}", "gate.kind=uniform", f"run_dir={tmp_path}"]
    )
    o = cfg.orchestrator
    assert summary.budget.as_metrics()["pipeline/rollouts_started"] == steps * o.batch_groups * o.group_size
    assert summary.budget.rollouts_untrained == 0


def test_the_report_states_what_an_abandoning_gate_started_and_no_step_trained_on(tmp_path):
    cfg, summary = run("configs/sim.yaml", SIM + ["orchestrator.steps=3", "gate.kind=sara", f"run_dir={tmp_path}"])
    b = summary.budget
    assert b.groups_abandoned > 0 and b.rollouts_untrained == b.rollouts_started - b.rollouts_trained > 0
    share = 100 * b.rollouts_untrained / b.rollouts_started
    assert f"| rollouts started that no step trained on | {b.rollouts_untrained} ({share:.1f}%) |" in summary_table(
        cfg, summary
    )
