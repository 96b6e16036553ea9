"""``bench engine``: the torch engine, generate and transformers' continuous batching on one workload."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from railgate.bench.throughput import HFContinuousBatching, main


def test_continuous_batching_samples_the_whole_workload_and_is_reusable():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions=32, bos_token_id=1, eos_token_id=2)
    ).eval()
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
