"""The noise scale in reports: the benchmark's table and regime note, the train report's paragraph."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from types import SimpleNamespace

from railgate.bench.allocation import regime_notes, report_text
from railgate.regime import NoiseScaleLog, regime, regime_sentence
from railgate.report import regime_paragraph


def fake_run(policy: str, seed: int, noise_scale, batch: float = 64.0, engine: str = "torch", low=None, high=None) -> dict:
    curve = [(0.0, 0.0, 0.0, 0.40, 0, 0.1), (10_000.0, 1e5, 50.0, 0.55, 100, 0.2), (20_000.0, 2e5, 100.0, 0.65, 200, 0.3)]
    return {"engine": engine, "scenario": "", "model": "", "policy": policy, "seed": seed, "budget": 20_000, "steps": 200,
            "wall_s": 1.0, "curve": curve, "effective_yield": 0.5, "rollouts": 20_000, "tokens": 2e5,
            "false_abandonment": math.nan, "abandoned_incomplete": 0, "controller": {},
            "noise_scale": noise_scale, "noise_scale_low": low if low is not None else noise_scale,
            "noise_scale_high": high if high is not None else noise_scale, "noise_scale_steps": 0 if engine == "sim" else 100,
            "batch_rollouts": batch}


def test_sentences_say_which_way_the_run_is_limited():
    assert "step-limited; smaller batches pay more than skipping saturated groups" in regime_sentence(256, 32)
    assert "8.0 times the noise scale" in regime_sentence(256, 32)
    assert "noise-limited; skipping saturated groups pays more than smaller batches" in regime_sentence(64, 640)
    assert regime(64, 64) == "near the noise scale" and "neither" in regime_sentence(64, 64)
    assert "not measured" in regime_sentence(64, None) and "learner.micro_batch" in regime_sentence(64, math.nan)


def test_benchmark_report_has_the_noise_scale_and_says_what_it_means():
    results = [fake_run("uniform", 0, 16.0), fake_run("uniform", 1, 16.0), fake_run("sara", 0, 8.0), fake_run("sara", 1, 10.0)]
    text = report_text(results, 0.2, "Allocation benchmark", "config x", 1.0)
    assert "| noise scale | noise scale 95% | batch / noise scale |" in text
    assert "| 16 ± 0 | 16 to 16 | 4.00 ± 0.00 |" in text and "| 9 ± 1 | 8 to 10 | 7.20 ± 0.80 |" in text
    assert "Real model (torch), GRPO's runs: the batch (64 rollouts) is 4.0 times the noise scale (16 rollouts; 95% " \
           "interval 16 to 16): progress is step-limited" in text


def test_simulator_runs_have_no_noise_scale_columns_or_note():
    results = [fake_run("uniform", 0, None, engine="sim"), fake_run("sara", 0, None, engine="sim")]
    assert regime_notes(results) == []
    text = report_text(results, 0.2, "Allocation benchmark", "config x", 1.0)
    assert "noise scale" not in text


def test_an_unresolved_gradient_gives_a_bound_and_a_resolved_one_an_interval():
    grad_sq = [1.0, -0.6, 0.8, -0.4, 0.3, -0.1]  # mean 1/6, standard error 0.24
    log = NoiseScaleLog.from_records([{"step": i, "learner/trace_sigma": 100.0, "learner/grad_sq": g,
                                       "learner/rollouts_trained": 64.0} for i, g in enumerate(grad_sq)])
    s = log.summary()
    assert s["noise_scale"] == pytest.approx(600.0) and s["noise_scale_high"] is None  # |G|² may be 0: unbounded
    assert s["noise_scale_low"] == pytest.approx(100 / (1 / 6 + 2 * np.std(grad_sq, ddof=1) / math.sqrt(6)))
    sentence = regime_sentence(s["batch_rollouts"], s["noise_scale"], s["noise_scale_low"], s["noise_scale_high"])
    assert "9.4 times below the noise scale (600 rollouts; 95% interval 144 to unbounded)" in sentence
    assert "noise-limited" in sentence and "not settled" not in sentence
    assert regime_sentence(64.0, 600.0, 100.0, None).endswith("(the interval reaches near the noise scale: not settled)")
    negative = NoiseScaleLog.from_records([{"step": i, "learner/trace_sigma": 100.0, "learner/grad_sq": g,
                                            "learner/rollouts_trained": 8.0} for i, g in enumerate([0.01, -0.03, 0.01])])
    n = negative.summary()
    assert n["noise_scale"] is None and n["noise_scale_low"] > 16
    assert regime_sentence(8.0, None, n["noise_scale_low"]).startswith("the gradient is not resolved over the run")
    hopeless = NoiseScaleLog.from_records([{"step": i, "learner/trace_sigma": 100.0, "learner/grad_sq": g}
                                           for i, g in enumerate([-0.5, -0.4, -0.6])]).summary()
    assert hopeless["noise_scale"] is None and hopeless["noise_scale_low"] is None and hopeless["noise_scale_steps"] == 3
    assert "not resolved over the run's 3 measured steps" in regime_sentence(8.0, None, None, None, steps=3)
    assert "not measured" in regime_sentence(8.0, None, None, None, steps=0)


def test_a_resumed_run_counts_each_step_once():
    log = NoiseScaleLog.from_records([
        {"step": 1, "learner/noise_scale": 100.0, "learner/rollouts_trained": 64.0},
        {"step": 2, "learner/noise_scale": 900.0, "learner/rollouts_trained": 64.0},  # redone after the resume
        {"step": 2, "learner/noise_scale": 300.0, "learner/rollouts_trained": 64.0},
        {"step": 3, "learner/noise_scale": None, "learner/rollouts_trained": 64.0},  # NaN written as null
    ])
    assert log.summary()["noise_scale_step_mean"] == 200.0 and log.summary()["noise_scale_steps"] == 0


def test_train_report_paragraph_from_metrics_jsonl(tmp_path):
    lines = [{"step": s, "learner/noise_scale": 20.0, "learner/rollouts_trained": 512.0, "learner/trace_sigma": 40.0,
              "learner/grad_sq": g} for s, g in ((1, 1.9), (2, 2.0), (3, 2.1))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    cfg = SimpleNamespace(run_dir=str(tmp_path), engine=SimpleNamespace(kind="torch"))
    text = regime_paragraph(cfg)
    assert "**Regime.** The batch (512 rollouts) is 25.6 times the noise scale (20 rollouts; 95% interval 19 to 21): " \
           "progress is step-limited; smaller batches pay more than skipping saturated groups." in text
    assert "from the micro-batches of 3 steps" in text
    assert regime_paragraph(SimpleNamespace(run_dir=str(tmp_path), engine=SimpleNamespace(kind="sim"))) == ""
    assert regime_paragraph(SimpleNamespace(run_dir=str(tmp_path / "none"), engine=SimpleNamespace(kind="torch"))) == ""
