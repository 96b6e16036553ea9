"""``task.name=env`` runs with the default config's gate: the reference prior, on by default for
tasks with references, steps aside for episodes, which have none."""

from __future__ import annotations

import json
from pathlib import Path

from run_helpers import cli_ok, tiny_agent_model


def test_the_default_config_with_an_environment_task_runs_sara_without_a_reference(tmp_path: Path):
    model = tiny_agent_model(tmp_path / "model")
    overrides = (
        "task.name=env",
        "task.env.class=pipeline.envs.chain:ChainEnv",
        f"model.path={model}",
        "orchestrator.batch_groups=2",
        "orchestrator.group_size=4",
        "orchestrator.max_tokens=8",
        "orchestrator.max_rollouts=48",
        "orchestrator.eval_every=0",
        "data.num_train_prompts=32",
        "data.num_eval_prompts=4",
        "log.checkpoint_every=0",
    )
    run = tmp_path / "run"
    sets = [arg for o in overrides for arg in ("--set", o)]
    cli_ok("train", *sets, "--run-dir", str(run), "--no-progress", timeout=600)
    assert "reference_prior: true" in (run / "config.yaml").read_text()  # the default, left on
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"].startswith("rollout budget")
    assert summary["budget"]["pipeline/rollouts_started"] >= 48
