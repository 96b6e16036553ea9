"""``bench engine``: the torch engine, generate and transformers' continuous batching on one workload."""

import torch

from pipeline.policy.models import build_model
from railgate.bench.throughput import HFContinuousBatching, main


def test_continuous_batching_samples_the_whole_workload_and_is_reusable():
    torch.manual_seed(0)
    model = build_model(32, 16, 1, 2, 32, seed=0, pad_id=None).eval()
    prompts = [[3, 4, 5], [6, 7]]
    cb = HFContinuousBatching(model, 3, 5, 1.0, eos_id=None, max_prompt_len=3, num_prompts=2)
    try:
        first, second = cb.run(prompts), cb.run(prompts)
    finally:
        cb.close()
    assert first["samples"] == second["samples"] == 6
    assert first["tokens"] == second["tokens"] == 6 * 5  # no end-of-sequence: every sample runs max_tokens
    assert first["tokens_per_cpu_s"] > 0


def test_main_reports_every_contender_against_the_better_peer(capsys):
    out = main(
        [
            "--model",
            "custom",
            "--arch",
            "gpt2",
            "--hidden",
            "32",
            "--layers",
            "1",
            "--vocab",
            "32",
            "--prompts",
            "2",
            "--prompt-len",
            "4",
            "--group",
            "2",
            "--max-tokens",
            "4",
            "--rounds",
            "1",
            "--threads",
            "1",
            "--delta-tokens",
            "4",
        ]
    )
    assert set(out["median"]) == {"generate", "continuous batching", "engine(delta_tokens=4)"}
    best = out["best_peer"]["tokens_per_cpu_s"]
    assert best == max(
        out["median"]["generate"]["tokens_per_cpu_s"], out["median"]["continuous batching"]["tokens_per_cpu_s"]
    )
    assert "continuous batching" in capsys.readouterr().out


def test_a_workload_longer_than_the_models_context_exits_with_status_2(capsys):
    import pytest

    with pytest.raises(SystemExit) as info:
        main(["--model", "project", "--max-tokens", "60"])
    assert info.value.code == 2
    assert "exceeds the model's context of 64 tokens" in capsys.readouterr().err
