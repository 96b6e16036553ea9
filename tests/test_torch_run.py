"""The real-model path end to end, small: warm start, torch engine, SARA, GRPO learner,
evaluation, checkpoint, eval command (slow: CI runs it)."""

from __future__ import annotations

import json

import pytest
from run_helpers import TORCH_SMALL, cli_ok, sets


@pytest.mark.slow
def test_torch_config_trains_end_to_end(tmp_path):
    cli_ok(
        *TORCH_SMALL,
        "--set",
        f"run_dir={tmp_path}",
        "--set",
        "model.warm_start_steps=40",  # micro_batch 16:
        "--set",
        "orchestrator.steps=3",
        "--set",
        "orchestrator.eval_every=3",  # 4 of them, both noise scales
        *sets("log.checkpoint_every=3", "gate.kind=uniform"),
        timeout=1500,
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["budget"]["pipeline/rollouts_started"] > 0
    assert "eval/accuracy" in summary["evals"][0] and "eval/pass@4" in summary["evals"][0]
    assert (tmp_path / "base_model" / "config.json").is_file()
    assert (tmp_path / "accuracy.png").read_bytes().startswith(b"\x89PNG")
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][
        1:
    ]  # after step 0's evaluation
    # every step measured: micro-batches from the first, consecutive steps from the second
    assert all(s["learner/noise_batch_small"] == pytest.approx(16, rel=0.1) for s in steps)
    assert all("learner/grad_dot_prev" in s for s in steps[1:]) and "learner/grad_dot_prev" not in steps[0]
    assert "**Regime.**" in (tmp_path / "report.md").read_text()
    cli_ok("eval", str(tmp_path), "--set", "data.num_eval_prompts=8", timeout=600)
