"""The real-model path end to end, small: warm start, torch engine, SARA, GRPO learner,
evaluation, checkpoint, eval command (slow: CI runs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_torch_config_trains_end_to_end(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, str(ROOT / "run.py"), "--config", "configs/default.yaml", "--no-progress",
            "--set", f"run_dir={tmp_path}", "--set", "model.warm_start_steps=40", "--set", "orchestrator.steps=3",
            "--set", "orchestrator.eval_every=3", "--set", "orchestrator.batch_groups=8",
            "--set", "data.num_train_prompts=256", "--set", "data.num_eval_prompts=32", "--set", "log.checkpoint_every=3",
            "--set", "gate.kind=uniform", "--set", "learner.micro_batch=16"]  # 4 micro-batches: both noise scales
    result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["budget"]["pipeline/rollouts_started"] > 0
    assert "eval/accuracy" in summary["evals"][0] and "eval/pass@4" in summary["evals"][0]
    assert (tmp_path / "base_model" / "config.json").is_file()
    assert (tmp_path / "accuracy.png").read_bytes().startswith(b"\x89PNG")
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][1:]  # after step 0's evaluation
    # every step measured: micro-batches from the first, consecutive steps from the second
    assert all(s["learner/noise_batch_small"] == pytest.approx(16, rel=0.1) for s in steps)
    assert all("learner/grad_dot_prev" in s for s in steps[1:]) and "learner/grad_dot_prev" not in steps[0]
    assert "**Regime.**" in (tmp_path / "report.md").read_text()
    evaluated = subprocess.run([sys.executable, str(ROOT / "run.py"), "eval", str(tmp_path), "--set", "data.num_eval_prompts=8"],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
