"""A user's reward function (``task.dataset.reward: "module:function"``, TRL's signature) on a
GSM8K-style JSONL with integer answers, chat-message prompts and extra fields: it gets the rows'
fields, ``None`` is counted and not trained on, raising and hanging are counted and the run goes
on, and successes are read against ``task.success_threshold``."""

from __future__ import annotations

import json
import math
import textwrap

import pyarrow.compute as pc
import pytest
import torch
from hf_models import save_tiny_llama
from run_helpers import sets
from safetensors.torch import load_file

from pipeline.config.build import ConfigError
from pipeline.evaluation import SamplingEvaluator
from pipeline.store.buffer import read_all
from pipeline.tasks.rewards.user import DatasetRow, UserReward, load_reward_function
from pipeline.types import GroupSnapshot, Prompt
from railgate.checkpoint import latest_checkpoint, load_checkpoint
from railgate.cli import main

REWARDS_PY = '''
import json, os, time

def shaped(prompts, completions, answer, source, **columns):
    """0, 1 or 2 by completion length (a summed, shaped reward); None, raise or hang by source."""
    with open(os.environ["REWARD_LOG"], "a") as log:
        log.write(json.dumps({"n": len(prompts), "answer": answer, "source": source, "level": columns["level"],
                              "chat": [isinstance(p, list) for p in prompts],
                              "completion_kind": [type(c).__name__ for c in completions]}) + "\\n")
    out = []
    for completion, s in zip(completions, source):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        if s == "none":
            out.append(None)
        elif s == "boom":
            raise RuntimeError("this reward breaks on purpose")
        elif s == "hang":
            time.sleep(1.5)
            out.append(0.0)
        else:
            out.append(float(len(text) % 3))
    return out
'''


def _rows() -> list[dict]:
    rows = []
    for i in range(40):
        question = f"What is {i} + {i + 3}?"
        prompt = [{"role": "user", "content": question}] if i % 2 else question
        source = {0: "none", 1: "boom", 2: "hang"}.get(i % 6, "gsm")
        rows.append({"question": prompt, "answer": 2 * i + 3, "source": source, "level": i % 3})
    return rows


@pytest.fixture(scope="module")
def user_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("user_reward")
    model = save_tiny_llama(root / "llama", context=64)
    (root / "my_rewards.py").write_text(REWARDS_PY)
    (root / "gsm.jsonl").write_text("\n".join(json.dumps(r) for r in _rows()) + "\n")
    return root, model


def test_a_users_reward_trains_on_a_gsm8k_style_jsonl(user_run, tmp_path, monkeypatch, capsys):
    root, model = user_run
    log = tmp_path / "calls.jsonl"
    monkeypatch.chdir(root)  # the module is found in the working directory
    monkeypatch.setenv("REWARD_LOG", str(log))
    run = tmp_path / "run"
    code = main(
        [
            "train",
            "--no-progress",
            "--run-dir",
            str(run),
            *sets(
                f"model.path={model}",
                "task.name=dataset",
                "task.dataset.train_path=gsm.jsonl",
                "task.dataset.prompt_field=question",
                "task.dataset.reward=my_rewards:shaped",
                "task.success_threshold=1.5",
                "task.eval_share=0.2",
                "orchestrator.reward_timeout_s=0.5",
                "orchestrator.steps=3",
                "orchestrator.batch_groups=6",
                "orchestrator.group_size=4",
                "orchestrator.max_tokens=6",
                "data.num_train_prompts=64",
                "data.num_eval_prompts=4",
                "data.eval_samples=2",
                "orchestrator.eval_every=3",
                "gate.kind=uniform",
                "log.checkpoint_every=3",
                "learner.lr=0.05",
            ),
        ]
    )
    assert code == 0, capsys.readouterr().err[-3000:]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert all(isinstance(a, int) for c in calls for a in c["answer"])  # the answer keeps its JSON type
    assert all(c["level"] and isinstance(c["level"][0], int) for c in calls)  # and the row its other fields
    kinds = {(chat, kind) for c in calls for chat, kind in zip(c["chat"], c["completion_kind"])}
    assert kinds == {(True, "list"), (False, "str")}  # chat prompts get TRL's conversational completions
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = steps[-1]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]  # step 0: the evaluation before training
    assert (
        last["pipeline/rewards_none"] > 0
        and last["pipeline/reward_errors"] > 0
        and last["pipeline/reward_timeouts"] > 0
    )
    buffer = read_all(run / "buffer")
    rewards = buffer.column("reward").to_pylist()
    assert not any(math.isnan(r) for r in rewards) and set(rewards) <= {0.0, 1.0, 2.0}  # None is not trained on
    assert pc.max(buffer.column("reward")).as_py() == 2.0
    trained = load_checkpoint(latest_checkpoint(run))["learner"]["model"]
    base = load_file(str(model / "model.safetensors"))
    assert any(not torch.equal(trained[k], base[k]) for k in base)  # mixed groups moved the weights
    assert "eval/accuracy" in json.loads((run / "summary.json").read_text())["evals"][-1]


def test_a_missing_module_or_function_is_one_clear_line(user_run, tmp_path, monkeypatch, capsys):
    root, model = user_run
    monkeypatch.chdir(root)
    base = [
        "train",
        "--no-progress",
        "--run-dir",
        str(tmp_path / "run"),
        *sets(
            f"model.path={model}",
            "task.name=dataset",
            "task.dataset.train_path=gsm.jsonl",
            "task.dataset.prompt_field=question",
        ),
    ]
    assert main([*base, "--set", "task.dataset.reward=no_such_module:f"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "module 'no_such_module' cannot be imported" in err
    assert main([*base, "--set", "task.dataset.reward=my_rewards:nope"]) == 2
    assert "has no function 'nope' (it has: shaped)" in capsys.readouterr().err
    assert main([*base, "--set", "task.dataset.reward=exactly"]) == 2
    assert "must be one of math_verify, exact, numeric or a function" in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_batches_of_any_size_and_bad_returns():
    rows = {i: DatasetRow(prompt=f"p{i}", columns={"answer": i}) for i in range(3)}
    prompts = [Prompt(i, f"p{i}", (1,)) for i in range(3)]
    seen = []

    def f(prompts, completions, answer):
        seen.append(len(prompts))
        return [None if a == 0 else float(c == str(a)) for c, a in zip(completions, answer)]

    reward = UserReward(f, decode=lambda ids: "".join(map(str, ids)), rows=rows)
    assert reward.score_batch(prompts, [[0], [1], [3]]) == [None, 1.0, 0.0] and reward(prompts[2], [2]) == 1.0
    assert seen == [3, 1]
    with pytest.raises(ValueError, match="returned 2 values for 3 completions"):
        UserReward(lambda prompts, completions, **kw: [1.0, 2.0], str, rows).score_batch(prompts, [[1]] * 3)
    with pytest.raises(ValueError, match="returned nan"):
        UserReward(lambda prompts, completions, **kw: [math.nan], str, rows)(prompts[0], [1])
    with pytest.raises(ConfigError, match=r"task.dataset.reward='json:nothing_here'.*has no function"):
        load_reward_function("json:nothing_here")


def test_success_is_reward_above_the_threshold():
    def snap(threshold):
        prompt = Prompt(0, "", (1,), success_threshold=threshold)
        return GroupSnapshot(
            0, prompt, 4, rewards=(1.0, 2.0, 1.0), in_flight=0, launched=3, failed=0, tokens=9, policy_version=0
        )

    assert (snap(0.5).successes, snap(0.5).is_mixed) == (3, False)  # summed rewards read at 0.5: all "successes"
    assert (snap(1.5).successes, snap(1.5).is_mixed) == (1, True)
    evaluator = SamplingEvaluator(
        engine=None, prompts=[Prompt(0, "", (1,), success_threshold=1.5)], scorer=None, samples_per_prompt=2
    )
    assert evaluator._summarise({0: [2.0, 1.0]})["eval/accuracy"] == 0.5


def test_none_rewards_are_counted_and_left_out_of_the_group():
    import anyio

    from pipeline.core.group import GroupRun
    from pipeline.tasks.rewards.scoring import ScoringService
    from pipeline.types import FinishReason, SampleFinished, SampleRequest, SamplingParams, ScoredSample

    class Maybe:
        runs_inline = False

        def __call__(self, prompt, token_ids):
            return None if token_ids[0] == 0 else 1.0

    service = ScoringService(Maybe(), timeout_s=5.0, threads=1)
    prompt = Prompt(0, "", (1,))
    group = GroupRun(0, prompt, 3, 0)
    for i in range(3):
        request = SampleRequest(f"g0-s{i}", 0, i, prompt, SamplingParams())
        reward, error = anyio.run(service.score, prompt, (min(i, 1),))
        group.add(
            ScoredSample(request, SampleFinished(request.request_id, (i,), (0.0,), FinishReason.STOP, 0), reward, error)
        )
    assert service.no_reward == 1 and service.errors == 0
    assert group.rewards == (1.0, 1.0) and group.snapshot(0, in_flight=0).failed == 1
    assert [r.sample_index for r in group.committed().rollouts] == [1, 2]


def test_reward_module_text_is_valid_python():
    compile(textwrap.dedent(REWARDS_PY), "my_rewards.py", "exec")


def test_the_readme_example_reward():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "my_rewards.py"
    spec = importlib.util.spec_from_file_location("my_rewards", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    completions = ["It is 42.", [{"role": "assistant", "content": "41, no: 43"}], "none"]
    assert module.correct(["q"] * 3, completions, answer=[42, 43, 1]) == [1.0, 1.0, 0.0]
