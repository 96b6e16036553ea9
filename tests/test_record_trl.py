"""``run.py record --trl-task``: a bench trl chat task recorded from a tiny Hugging Face chat model.

The rows are bench trl's (its order of the seed), the prompts TRL's chat rendering, the rewards
the task's TRL reward on the decoded completions, the reference likelihoods TRL's reference
prior's, the difficulty the task's level.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from hf_models import save_tiny_llama

from pipeline.store.grouplog import read_group_log
from railgate.bench.trl import paired_order
from railgate.bench.trl_tasks import mixed_questions
from railgate.cli import main

P, K = 4, 4
SIZES = ("--train-prompts", "30", "--eval-prompts", "6")


def trl_args(out, model, *more):
    return [
        "record",
        "--no-progress",
        "--trl-task",
        "mixed",
        *SIZES,
        "--prompts",
        str(P),
        "--samples",
        str(K),
        "--batch-prompts",
        "2",
        "--model",
        str(model),
        "--out",
        str(out),
        *more,
    ]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("record_trl")
    model = save_tiny_llama(root / "llama")
    out = root / "log"
    assert main(trl_args(out, model)) == 0
    return out, model


def test_the_log_holds_bench_trls_rows_rendered_sampled_and_scored_as_trl_does(recorded):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, model_dir = recorded
    log = read_group_log(out)
    assert len(log.groups) == P and log.group_size == K
    task = mixed_questions(30, 6, seed=0)
    order = paired_order(list(enumerate(task.train_rows)), 0)[:P]
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    for g, (index, row) in zip(sorted(log.groups, key=lambda g: g.group_id), order):
        assert (g.prompt_id, g.answer, g.difficulty) == (index, row["answer"], row["operations"])
        assert json.loads(g.prompt_text) == row["prompt"]
        prompt_ids = tok.apply_chat_template(
            [row["prompt"]], add_generation_prompt=True, tokenize=True, return_dict=True
        )
        prompt_ids = list(prompt_ids["input_ids"][0])
        for s in g.samples:
            assert s.num_tokens == len(s.token_ids) <= 12  # the chat tasks' max_completion_length
            assert s.text == tok.decode(list(s.token_ids), skip_special_tokens=True)
            completion = [{"role": "assistant", "content": s.text}]
            assert [s.reward] == task.reward([row["prompt"]], [completion], answer=[row["answer"]])
        # TRL's reference prior: the reference's tokens, teacher-forced; no end-of-sequence token, as
        # the task's reference is not exact (a completion only has to write it first)
        assert not task.reference_exact
        ref = tok(text=[row["reference"]], add_special_tokens=False)["input_ids"][0]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([prompt_ids + ref])).logits[0].float(), -1)
        expected = sum(logp[len(prompt_ids) - 1 + i, t].item() for i, t in enumerate(ref))
        # not null: the scorer found the reference earns the task's reward (a null one never does)
        assert g.reference_logprob is not None and math.isclose(g.reference_logprob, expected, abs_tol=1e-3)
    manifest = json.loads((out / "record.json").read_text())
    assert manifest["task"] == {
        "trl_task": "mixed",
        "reward": "last",
        "train_prompts": 30,
        "eval_prompts": 6,
        "task_seed": 0,
    }
    assert manifest["sampling"] == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 12}


def test_a_resume_with_another_reward_or_seed_is_refused_and_another_seed_reorders(recorded, tmp_path, capsys):
    out, model = recorded
    assert main(trl_args(out, model)) == 0  # the same command: nothing left to record
    assert "recorded 0 groups" in capsys.readouterr().out
    assert main(trl_args(out, model, "--trl-reward", "marker")) == 2
    assert "task.reward='last', not 'marker'" in capsys.readouterr().err
    other = tmp_path / "seed1"
    assert main(trl_args(other, model, "--seed", "1")) == 0
    task = mixed_questions(30, 6, seed=0)
    expected = [i for i, _ in paired_order(list(enumerate(task.train_rows)), 1)[:P]]
    assert [g.prompt_id for g in sorted(read_group_log(other).groups, key=lambda g: g.group_id)] == expected


def test_trl_task_without_a_model_or_with_a_task_is_refused(tmp_path, capsys):
    argv = ["record", "--no-progress", "--trl-task", "word", "--prompts", "2", "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    assert "--model" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
