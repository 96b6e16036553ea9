"""``engine.kind: ray`` from the run config: a real-model run whose rollouts come from two
torch replicas on a local Ray cluster (integration: starts Ray; CI runs it)."""

from __future__ import annotations

import json

import pytest
from run_helpers import AGENT_SHORT_RUN, cli, cli_ok, sets, tiny_agent_model


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


@pytest.mark.integration
def test_multi_turn_episodes_run_on_ray_replicas(tmp_path):
    """The agent config on two Ray replicas: each rollout is an episode of turns whose observations
    are masked out of the loss, as on the in-process engine."""
    from configs import CONFIG_DIR
    from pipeline.store.buffer import read_all

    path = tiny_agent_model(tmp_path / "model")
    run = tmp_path / "run"
    cli_ok(
        "--config",
        str(CONFIG_DIR / "agent.yaml"),
        "--no-progress",
        *sets(
            f"model.path={path}",
            f"run_dir={run}",
            "engine.kind=ray",
            "engine.ray.replicas=2",
            "engine.ray.num_cpus=0.5",
            *AGENT_SHORT_RUN,
        ),
        timeout=900,
    )
    rows = read_all(run / "buffer").to_pylist()
    assert len(rows) == 2 * 2 * 4
    for r in rows:
        assert r["turn_ends"] and len(r["turn_rewards"]) == len(r["turn_ends"])
        assert len(r["policy_mask"]) == len(r["token_ids"])
        if len(r["turn_ends"]) > 1:  # the environment answered between turns: its tokens are not the policy's
            assert not all(r["policy_mask"])
    assert any(len(r["turn_ends"]) > 1 for r in rows)
    budget = json.loads((run / "summary.json").read_text())["budget"]
    assert budget["pipeline/env_failures"] == 0 and budget["pipeline/rollouts_failed"] == 0
