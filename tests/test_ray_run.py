"""``engine.kind: ray`` from the run config: a real-model run whose rollouts come from two
torch replicas on a local Ray cluster (integration: starts Ray; CI runs it)."""

from __future__ import annotations

import json

import pytest
from run_helpers import cli, cli_ok, sets


@pytest.mark.integration
def test_train_with_ray_replicas_from_the_config(tmp_path):
    cli_ok(
        "--no-progress",
        *sets(
            f"run_dir={tmp_path}",
            "engine.kind=ray",
            "engine.ray.replicas=2",
            "engine.ray.num_cpus=0.5",
            "model.warm_start_steps=30",
            "orchestrator.steps=2",
            "orchestrator.eval_every=2",
            "orchestrator.batch_groups=4",
            "data.num_train_prompts=64",
            "data.num_eval_prompts=16",
            "log.checkpoint_every=0",
            "gate.kind=uniform",
        ),
        timeout=900,
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 2
    assert summary["budget"]["pipeline/rollouts_started"] >= 2 * 4 * 8
    assert summary["budget"]["pipeline/rollouts_failed"] == 0
    assert "eval/accuracy" in summary["evals"][-1]


def test_a_bad_ray_setting_is_a_config_error(tmp_path):
    result = cli(
        "--set", "engine.kind=ray", "--set", "engine.ray.replicas=0", "--set", f"run_dir={tmp_path}", timeout=120
    )
    assert result.returncode == 2
    assert "engine.ray.replicas=0 must be >= 1" in result.stderr
