"""The noise scale in reports: the run summary, the benchmark's table and regime note, the train
report's paragraph."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from railgate.bench.allocation_report import regime_notes, report_text
from railgate.regime import NoiseScaleLog, combine, regime, regime_sentence, regime_text
from railgate.report import regime_paragraph


def fake_run(
    policy: str,
    seed: int,
    noise_scale,
    batch: float = 64.0,
    engine: str = "torch",
    low="point",
    high="point",
    micro=None,
) -> dict:
    curve = [
        (0.0, 0.0, 0.0, 0.40, 0, 0.1),
        (10_000.0, 1e5, 50.0, 0.55, 100, 0.2),
        (20_000.0, 2e5, 100.0, 0.65, 200, 0.3),
    ]
    steps = 0 if engine == "sim" else 100
    return {
        "engine": engine,
        "scenario": "",
        "model": "",
        "policy": policy,
        "seed": seed,
        "budget": 20_000,
        "steps": 200,
        "wall_s": 1.0,
        "curve": curve,
        "effective_yield": 0.5,
        "rollouts": 20_000,
        "tokens": 2e5,
        "false_abandonment": math.nan,
        "abandoned_incomplete": 0,
        "controller": {},
        "noise_scale": noise_scale,
        "noise_scale_low": noise_scale if low == "point" else low,
        "noise_scale_high": noise_scale if high == "point" else high,
        "noise_scale_steps": steps,
        "noise_scale_micro": micro,
        "noise_scale_micro_low": micro,
        "noise_scale_micro_high": micro,
        "noise_scale_micro_steps": steps if micro is not None else 0,
        "batch_rollouts": batch,
    }


def steps_log(traces, grad_sqs, batch=64.0, micro=False) -> NoiseScaleLog:
    keys = (
        ("learner/trace_sigma_micro", "learner/grad_sq_micro")
        if micro
        else ("learner/trace_sigma", "learner/grad_dot_prev")
    )
    return NoiseScaleLog.from_records(
        [
            {"step": i, keys[0]: t, keys[1]: g, "learner/rollouts_trained": batch}
            for i, (t, g) in enumerate(zip(traces, grad_sqs))
        ]
    )


def test_sentences_say_which_way_the_run_is_limited():
    assert "step-limited; smaller batches pay more than skipping saturated groups" in regime_sentence(256, 32)
    assert "8.0 times the noise scale" in regime_sentence(256, 32)
    assert "noise-limited; skipping saturated groups pays more than smaller batches" in regime_sentence(64, 640)
    assert regime(64, 64) == "near the noise scale" and "neither" in regime_sentence(64, 64)
    assert "not measured" in regime_sentence(64, None) and "not measured" in regime_sentence(64, math.nan)


def test_the_run_noise_scale_is_the_ratio_of_run_means_with_fieller_interval():
    grad_sq = [1.0, -0.6, 0.8, -0.4, 0.3, -0.1]  # mean 1/6, standard error 0.24: |G|² not clear of 0
    s = steps_log([100.0] * 6, grad_sq).summary()
    assert s["noise_scale"] == pytest.approx(600.0) and s["noise_scale_steps"] == 6
    assert s["noise_scale_high"] is None  # unbounded above
    # with tr(Σ) constant, Fieller's lower end is tr / (mean + 2 se)
    assert s["noise_scale_low"] == pytest.approx(100 / (1 / 6 + 2 * np.std(grad_sq, ddof=1) / math.sqrt(6)))
    sentence = regime_sentence(s["batch_rollouts"], s["noise_scale"], s["noise_scale_low"], s["noise_scale_high"])
    assert (
        "the noise scale (600 rollouts; 95% interval 144 to unbounded) is 9.4 times the batch (64 rollouts)" in sentence
    )
    assert "noise-limited" in sentence and "not settled" not in sentence
    assert regime_sentence(64.0, 600.0, 100.0, None).endswith(
        "(the interval reaches near the noise scale: not settled)"
    )
    resolved = steps_log([100.0, 120.0, 80.0, 100.0], [2.0, 2.2, 1.8, 2.0]).summary()
    assert resolved["noise_scale"] == pytest.approx(50.0)
    assert 40 < resolved["noise_scale_low"] < 50.0 < resolved["noise_scale_high"] < 60


def test_an_unresolved_or_biased_gradient_gives_a_bound_or_nothing():
    n = steps_log([100.0] * 3, [0.01, -0.03, 0.01], batch=8.0).summary()
    assert n["noise_scale"] is None and n["noise_scale_low"] > 16
    assert regime_sentence(8.0, None, n["noise_scale_low"]).startswith("the gradient is not resolved over the run")
    negative = steps_log([100.0] * 3, [-0.5, -0.4, -0.6]).summary()  # |G|² clearly below 0: a biased estimate
    assert (
        negative["noise_scale"] is None and negative["noise_scale_low"] is None and negative["noise_scale_steps"] == 3
    )
    assert "not resolved over the run's 3 measured steps" in regime_sentence(8.0, None, None, None, steps=3)
    assert "not measured" in regime_sentence(8.0, None, None, None, steps=0)


def test_micro_batch_and_consecutive_step_estimates_are_summarised_apart():
    log = steps_log([100.0] * 4, [1.0] * 4)
    for i, record in enumerate(steps_log([300.0] * 4, [1.0] * 4, micro=True)._steps.values()):
        log(i, {**log._steps[i], **record})
    s = log.summary()
    assert s["noise_scale"] == pytest.approx(100.0) and s["noise_scale_micro"] == pytest.approx(300.0)
    text = regime_text(s)
    assert text.startswith(
        "The batch (64 rollouts) is 0.6 times the noise scale (100 rollouts; 95% interval 100 to 100): near"
    )
    assert (
        "The micro-batch estimate (within each step; biased when the batch is far below the noise scale): "
        "300 rollouts (95% interval 300 to 300)." in text
    )


def test_a_resumed_run_counts_each_step_once():
    log = NoiseScaleLog.from_records(
        [
            {"step": 1, "learner/noise_scale": 100.0, "learner/rollouts_trained": 64.0},
            {"step": 2, "learner/noise_scale": 900.0, "learner/rollouts_trained": 64.0},  # redone after the resume
            {"step": 2, "learner/noise_scale": 300.0, "learner/rollouts_trained": 64.0},
            {"step": 3, "learner/noise_scale": None, "learner/rollouts_trained": 64.0},  # NaN written as null
        ]
    )
    assert log.summary()["noise_scale_step_mean"] == 200.0 and log.summary()["noise_scale_steps"] == 0


def test_seeds_combine_to_the_mean_point_and_the_widest_interval():
    runs = [fake_run("uniform", 0, 100.0, low=50.0, high=300.0), fake_run("uniform", 1, 200.0, low=80.0, high=None)]
    c = combine(runs)
    assert (c["noise_scale"], c["noise_scale_low"], c["noise_scale_high"], c["noise_scale_steps"]) == (
        150.0,
        50.0,
        None,
        100,
    )


def test_benchmark_report_has_the_noise_scale_and_says_what_it_means():
    results = [
        fake_run("uniform", 0, 16.0, micro=20.0),
        fake_run("uniform", 1, 16.0, micro=22.0),
        fake_run("sara", 0, 8.0),
        fake_run("sara", 1, 10.0),
    ]
    text = report_text(results, 0.2, "Allocation benchmark", "config x", 1.0)
    assert (
        "| noise scale | noise scale 95% | batch / noise scale | noise scale (micro-batches) | micro-batches 95% |"
        in text
    )
    assert "| 16 ± 0 | 16 to 16 | 4.00 ± 0.00 | 21 ± 1 | 20 to 22 |" in text
    assert "| 9 ± 1 | 8 to 10 | 7.20 ± 0.80 | n/a | n/a |" in text
    assert (
        "Real model (torch), GRPO's runs: The batch (64 rollouts) is 4.0 times the noise scale (16 rollouts; 95% "
        "interval 16 to 16): progress is step-limited; smaller batches pay more than skipping saturated groups." in text
    )


def test_simulator_runs_have_no_noise_scale_columns_or_note():
    results = [fake_run("uniform", 0, None, engine="sim"), fake_run("sara", 0, None, engine="sim")]
    assert regime_notes(results) == []
    text = report_text(results, 0.2, "Allocation benchmark", "config x", 1.0)
    assert "noise scale" not in text


def test_train_report_paragraph_from_metrics_jsonl(tmp_path):
    lines = [
        {
            "step": s,
            "learner/noise_scale": 20.0,
            "learner/rollouts_trained": 512.0,
            "learner/trace_sigma": t,
            "learner/grad_dot_prev": g,
        }
        for s, t, g in ((1, 38.0, 1.9), (2, 40.0, 2.0), (3, 42.0, 2.1))
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    cfg = SimpleNamespace(run_dir=str(tmp_path), engine=SimpleNamespace(kind="torch"))
    text = regime_paragraph(cfg)
    assert (
        "**Regime.** The batch (512 rollouts) is 25.6 times the noise scale (20 rollouts; 95% interval 20 to 20): "
        "progress is step-limited; smaller batches pay more than skipping saturated groups." in text
    )
    assert "micro-batch" not in text  # none logged
    assert regime_paragraph(SimpleNamespace(run_dir=str(tmp_path), engine=SimpleNamespace(kind="sim"))) == ""
    assert regime_paragraph(SimpleNamespace(run_dir=str(tmp_path / "none"), engine=SimpleNamespace(kind="torch"))) == ""
