"""The noise scale in reports: the benchmark's table and regime note, the train report's paragraph."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

from railgate.bench.allocation import regime_notes, report_text
from railgate.regime import NoiseScaleLog, regime, regime_sentence
from railgate.report import regime_paragraph


def fake_run(policy: str, seed: int, noise_scale, batch: float = 64.0, engine: str = "torch") -> dict:
    curve = [(0.0, 0.0, 0.0, 0.40, 0, 0.1), (10_000.0, 1e5, 50.0, 0.55, 100, 0.2), (20_000.0, 2e5, 100.0, 0.65, 200, 0.3)]
    return {"engine": engine, "scenario": "", "model": "", "policy": policy, "seed": seed, "budget": 20_000, "steps": 200,
            "wall_s": 1.0, "curve": curve, "effective_yield": 0.5, "rollouts": 20_000, "tokens": 2e5,
            "false_abandonment": math.nan, "abandoned_incomplete": 0, "controller": {},
            "noise_scale": noise_scale, "batch_rollouts": batch}


def test_sentences_say_which_way_the_run_is_limited():
    assert "step-limited; smaller batches pay more than skipping saturated groups" in regime_sentence(256, 32)
    assert "8.0 times the noise scale" in regime_sentence(256, 32)
    assert "noise-limited; skipping saturated groups pays more than smaller batches" in regime_sentence(64, 640)
    assert regime(64, 64) == "near the noise scale" and "neither" in regime_sentence(64, 64)
    assert "not measured" in regime_sentence(64, None) and "learner.micro_batch" in regime_sentence(64, math.nan)


def test_benchmark_report_has_the_noise_scale_and_says_what_it_means():
    results = [fake_run("uniform", 0, 16.0), fake_run("uniform", 1, 16.0), fake_run("sara", 0, 8.0), fake_run("sara", 1, 10.0)]
    text = report_text(results, 0.2, "Allocation benchmark", "config x", 1.0)
    assert "| noise scale | batch / noise scale |" in text
    assert "| 16 ± 0 | 4.00 ± 0.00 |" in text and "| 9 ± 1 | 7.20 ± 0.80 |" in text
    assert "Real model (torch), GRPO's runs: the batch (64 rollouts) is 4.0 times the noise scale (16 rollouts): " \
           "progress is step-limited" in text


def test_simulator_runs_have_no_noise_scale_columns_or_note():
    results = [fake_run("uniform", 0, None, engine="sim"), fake_run("sara", 0, None, engine="sim")]
    assert regime_notes(results) == []
    text = report_text(results, 0.2, "Allocation benchmark", "config x", 1.0)
    assert "noise scale" not in text


def test_a_resumed_run_counts_each_step_once():
    log = NoiseScaleLog.from_records([
        {"step": 1, "learner/noise_scale": 100.0, "learner/rollouts_trained": 64.0},
        {"step": 2, "learner/noise_scale": 900.0, "learner/rollouts_trained": 64.0},  # redone after the resume
        {"step": 2, "learner/noise_scale": 300.0, "learner/rollouts_trained": 64.0},
        {"step": 3, "learner/noise_scale": None, "learner/rollouts_trained": 64.0},  # NaN written as null
    ])
    assert log.summary()["noise_scale"] == 200.0 and log.summary()["noise_scale_steps"] == 2


def test_train_report_paragraph_from_metrics_jsonl(tmp_path):
    lines = [{"step": s, "learner/noise_scale": 20.0, "learner/rollouts_trained": 512.0, "learner/trace_sigma": 40.0,
              "learner/grad_sq": 2.0} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    cfg = SimpleNamespace(run_dir=str(tmp_path), engine=SimpleNamespace(kind="torch"))
    text = regime_paragraph(cfg)
    assert "**Regime.** the batch (512 rollouts) is 25.6 times the noise scale (20 rollouts): progress is step-limited" in text
    assert "mean over 3 steps" in text
    assert regime_paragraph(SimpleNamespace(run_dir=str(tmp_path), engine=SimpleNamespace(kind="sim"))) == ""
    assert regime_paragraph(SimpleNamespace(run_dir=str(tmp_path / "none"), engine=SimpleNamespace(kind="torch"))) == ""
