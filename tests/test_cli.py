"""run.py in a subprocess, as a user runs it: train, shadow, replay, and bad input."""

from __future__ import annotations

import json

from run_helpers import SMALL, sets
from run_helpers import cli as run


def test_train_writes_the_run_directory(tmp_path):
    result = run(
        "train",
        "--config",
        "configs/sim.yaml",
        "--run-dir",
        str(tmp_path),
        *sets("orchestrator.steps=3", "orchestrator.eval_every=1"),
        *SMALL,
    )
    assert result.returncode == 0, result.stderr
    assert "held-out accuracy at end" in result.stdout
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1, 2, 3]  # step 0: the evaluation before training
    assert json.loads(lines[0])["eval/accuracy_lo"] <= json.loads(lines[0])["eval/accuracy"]
    assert "pipeline/rollouts_started" in json.loads(lines[-1])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["stop_reason"] == "steps"
    assert any((tmp_path / "trace").glob("decisions-*.arrows"))
    assert any((tmp_path / "buffer").glob("steps-*.arrows"))
    png = (tmp_path / "accuracy.png").read_bytes()
    assert png.startswith(b"\x89PNG") and "accuracy.png" in (tmp_path / "report.md").read_text()

    evaluated = run("eval", str(tmp_path))
    assert evaluated.returncode == 0, evaluated.stderr
    result = json.loads((tmp_path / "eval_step3.json").read_text())
    assert result["eval/accuracy"] == summary["evals"][-1]["eval/accuracy"]  # the checkpoint's policy


def test_unknown_config_key_names_the_key_and_the_fix(tmp_path):
    result = run("train", "--run-dir", str(tmp_path), "--set", "orchestrator.group_sise=8")
    assert result.returncode == 2
    assert "unknown key 'orchestrator.group_sise'" in result.stderr and "group_size" in result.stderr


def test_invalid_value_names_the_value_and_the_constraint(tmp_path):
    result = run("train", "--run-dir", str(tmp_path), "--set", "gate.kind=sara", "--set", "gate.sara.tau_abandon=0.9")
    assert result.returncode == 2
    assert "tau_abandon=0.9" in result.stderr and "tau_commit" in result.stderr


def test_missing_config_file_is_a_clear_error(tmp_path):
    result = run("train", "--config", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2 and "does not exist" in result.stderr


def test_resume_without_a_checkpoint_says_what_to_do(tmp_path):
    (tmp_path / "config.yaml").write_text("run_dir: x\n")
    result = run("train", "--resume", str(tmp_path))
    assert result.returncode == 2 and "no checkpoint" in result.stderr


def test_shadow_then_replay(tmp_path):
    run_dir = tmp_path / "shadow"
    result = run(
        "shadow",
        "--config",
        "configs/sim.yaml",
        "--run-dir",
        str(run_dir),
        *sets("gate.kind=sara", "orchestrator.steps=4"),
        *SMALL,
    )
    assert result.returncode == 0, result.stderr
    assert (run_dir / "offpolicy.md").is_file()
    assert "learned" in result.stdout and "DR" in result.stdout
    out = tmp_path / "replay"
    result = run("replay", str(run_dir / "trace"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert (out / "offpolicy.png").is_file()


def test_replay_of_a_missing_trace_is_a_clear_error(tmp_path):
    result = run("replay", str(tmp_path / "no-trace"))
    assert result.returncode == 2 and "does not exist" in result.stderr


def test_prompt_longer_than_the_context_is_a_clear_error_before_any_warm_start(tmp_path):
    result = run("train", "--run-dir", str(tmp_path), "--set", "model.max_len=24", "--no-progress")
    assert result.returncode == 2, result.stderr
    assert "longer than model.max_len=24" in result.stderr and "raise model.max_len" in result.stderr
    assert not (tmp_path / "base_model").exists()
