"""``run.py record``: full groups from a real model into a group log, reproducible and resumable.

A tiny project GPT-2 (2 warm-start steps, built once in the module's run directory, as
``python run.py`` builds its base model) records a few prompts x 4 samples on the torch engine.
"""

from __future__ import annotations

import math
import signal
import textwrap
import time
from pathlib import Path

import pytest
import torch

from pipeline.store.grouplog import read_group_log, recorded_groups
from pipeline.types import Prompt
from railgate.cli import main
from tests.run_helpers import ROOT, cli, cli_env, cli_popen, sets

TINY = sets(
    "model.d_model=32",
    "model.n_layers=1",
    "model.warm_start_steps=2",
    "model.warm_start_target=0",
    "model.warm_start_batch=8",
    "data.num_train_prompts=64",
    "data.num_eval_prompts=8",
)
P, K = 6, 4


def record_args(out: Path, model: Path, *more: str, prompts: int = P) -> list[str]:
    return [
        "record",
        "--no-progress",
        "--prompts",
        str(prompts),
        "--samples",
        str(K),
        "--batch-prompts",
        "2",
        "--out",
        str(out),
        "--model",
        str(model),
        *TINY,
        *more,
    ]


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """A recording without --model: the base model is warm-started into the run directory."""
    root = tmp_path_factory.mktemp("record")
    out = root / "log"
    argv = ["record", "--no-progress", "--prompts", str(P), "--samples", str(K), "--batch-prompts", "2"]
    assert main([*argv, "--out", str(out), *TINY, "--set", f"run_dir={root / 'run'}"]) == 0
    return out, root / "run" / "base_model"


def _cfg_and_task(model: Path):
    from pipeline.tasks import build_task
    from railgate.config import load_config

    cfg = load_config(ROOT / "configs" / "default.yaml", [a for a in TINY if a != "--set"] + [f"model.path={model}"])
    return cfg, build_task(cfg.task)


def test_a_recording_holds_p_groups_of_k_scored_by_the_task_with_reference_likelihoods(first):
    from pipeline.policy.models import load_model
    from pipeline.seeding import derive_seed

    out, model = first
    log = read_group_log(out)
    assert len(log.groups) == P and log.group_size == K
    cfg, task = _cfg_and_task(model)
    base = load_model(model)
    tok = base.tokenizer
    problems = task.train_problems(cfg.data.num_train_prompts, derive_seed(cfg.data.seed, "train"))[:P]
    assert [g.group_id for g in log.groups] == list(range(P))
    for g, problem in zip(log.groups, problems):
        prompt = task.to_prompt(problem, tok.encode_prompt)
        assert (g.prompt_id, g.prompt_text, g.answer, g.step) == (prompt.prompt_id, prompt.text, prompt.answer, 0)
        assert sorted(s.finish_order for s in g.samples) == list(range(K))
        # every sample of a group joined the decode batch at one step: a longer one never ends first
        tokens_in_finish_order = [s.num_tokens for s in g.in_finish_order()]
        assert tokens_in_finish_order == sorted(tokens_in_finish_order)
        for s in g.samples:
            assert s.text == tok.decode(s.token_ids) and s.num_tokens == len(s.token_ids) >= 1
            assert s.reward == task.score(prompt, s.text)
            assert (s.finish_reason.name == "STOP") == (s.token_ids[-1] == tok.eos_id)
            assert s.policy_version == 0
        # the policy's teacher-forced log-likelihood of the solution and end-of-sequence
        ref = tok.encode(problem.solution) + [tok.eos_id]
        ids = torch.tensor([list(prompt.token_ids) + ref])
        with torch.no_grad():
            logp = torch.log_softmax(base.model(ids).logits[0].float(), -1)
        n = len(prompt.token_ids)
        expected = sum(logp[n - 1 + i, t].item() for i, t in enumerate(ref))
        assert g.reference_logprob is not None and math.isclose(g.reference_logprob, expected, abs_tol=1e-3)


def test_the_same_seed_records_the_same_log_and_another_seed_another(first, tmp_path):
    out, model = first
    again, other = tmp_path / "again", tmp_path / "other"
    assert main(record_args(again, model)) == 0  # --model: the same files, loaded from their directory
    assert read_group_log(again).groups == read_group_log(out).groups
    assert main(record_args(other, model, "--seed", "1")) == 0
    a, b = read_group_log(out).groups, read_group_log(other).groups
    assert [g.prompt_id for g in a] == [g.prompt_id for g in b]
    assert [s.token_ids for g in a for s in g.samples] != [s.token_ids for g in b for s in g.samples]


def test_a_resume_with_other_settings_is_refused_naming_out_and_the_fix(first, tmp_path, capsys):
    _, model = first
    out = tmp_path / "log"
    assert main(record_args(out, model, prompts=2)) == 0
    before = sorted(p.name for p in out.iterdir())
    for more, what in (
        (("--seed", "1"), "seed=0, not seed=1"),
        (sets("orchestrator.temperature=0.5", "gate.sara.reference_prior=false"), "sampling.temperature=1.0, not 0.5"),
        (("--set", "task.arithmetic.max_digits=3"), "task.arithmetic"),
    ):
        capsys.readouterr()
        assert main(record_args(out, model, *more, prompts=2)) == 2
        err = capsys.readouterr().err
        assert f"--out {out}" in err and what in err and "new --out" in err
    other_k = record_args(out, model, prompts=2)
    other_k[other_k.index("--samples") + 1] = "3"
    assert main(other_k) == 2
    assert "samples=4, not samples=3" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == before  # nothing written


def test_a_completed_recording_resumed_records_nothing_more(first, tmp_path, capsys):
    out, model = first
    copy = tmp_path / "log"
    import shutil

    shutil.copytree(out, copy)
    assert main(record_args(copy, model)) == 0
    assert "recorded 0 groups" in capsys.readouterr().out
    assert sorted(p.name for p in copy.glob("groups-*")) == ["groups-00000.arrows"]


CRASH = textwrap.dedent(
    """
    import os, signal, sys
    from pipeline.store import grouplog
    from railgate.cli import main

    write = grouplog.GroupLogWriter.write
    calls = []

    def crash_on_third(self, groups):  # the third batch is sampled, then the process dies
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        write(self, groups)

    grouplog.GroupLogWriter.write = crash_on_third
    sys.exit(main(sys.argv[1:]))
    """
)


def test_a_crash_mid_batch_loses_that_batch_and_the_resume_equals_an_uninterrupted_log(first, tmp_path, capsys):
    import subprocess
    import sys

    _, model = first
    full, out = tmp_path / "full", tmp_path / "crashed"
    n = 10
    assert main(record_args(full, model, prompts=n)) == 0
    crashed = subprocess.run(
        [sys.executable, "-c", CRASH, *record_args(out, model, prompts=n)],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    assert [g.group_id for g in recorded_groups(out)] == [0, 1, 2, 3]  # two batches of 2 were durable
    capsys.readouterr()
    assert main(record_args(out, model, prompts=n)) == 0  # the same command resumes
    assert "4 were there already" in capsys.readouterr().out
    log = read_group_log(out)
    assert len(log.sources) == 2  # the resume wrote a segment of its own
    assert sorted(g.group_id for g in log.groups) == list(range(n))  # every prompt exactly once
    assert sorted(log.groups, key=lambda g: g.group_id) == list(read_group_log(full).groups)


@pytest.mark.filterwarnings("ignore::pipeline.store.arrowio.TornSegmentWarning")  # polled while it writes
def test_ctrl_c_stops_a_recording_that_the_same_command_then_finishes(first, tmp_path):
    _, model = first
    out, n = tmp_path / "log", 48
    args = record_args(out, model, prompts=n)
    args[args.index("--batch-prompts") + 1] = "1"
    proc = cli_popen(*args, text=True)
    deadline = time.monotonic() + 60
    while not (out.exists() and len(recorded_groups(out)) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, "the recording ended before it was interrupted"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    held = len(recorded_groups(out))
    assert 2 <= held < n and f"keeps the {held} groups" in err and "same command" in err
    assert main(args) == 0
    assert sorted(g.group_id for g in read_group_log(out).groups) == list(range(n))


@pytest.mark.slow
def test_vllm_records_the_same_shape_of_log(tmp_path):
    """vLLM (CPU) over a model whose head size its kernels take (32)."""
    out, run = tmp_path / "log", tmp_path / "run"
    vllm_model = sets("model.d_model=64", "model.n_heads=2", f"run_dir={run}")
    argv = ["record", "--no-progress", "--prompts", "4", "--samples", str(K), "--engine", "vllm", "--out", str(out)]
    result = cli(*argv, *TINY, *vllm_model, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    log = read_group_log(out)
    assert len(log.groups) == 4 and log.group_size == K
    _, task = _cfg_and_task(run / "base_model")
    for g in log.groups:
        assert sorted(s.finish_order for s in g.samples) == list(range(K))
        prompt = Prompt(g.prompt_id, g.prompt_text, (), g.answer, success_threshold=g.success_threshold)
        for s in g.samples:
            assert s.num_tokens == len(s.token_ids) and s.reward == task.score(prompt, s.text)
        assert g.reference_logprob is not None and g.reference_logprob < 0
