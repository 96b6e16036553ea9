"""A reward that never works stops the run with the reason (issue 31): failures are counted as
they happen, the run stops naming the function and its first failure when each of the first
rewards failed, the held-out evaluation reports its failures and fails when all did, timeouts
are bounded at load, and reward code that ends its process costs rewards, not the run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest
from hf_models import save_tiny_llama
from run_helpers import cli, sets

from pipeline.config.build import ConfigError
from pipeline.config.sections import SimConfig
from pipeline.evaluation import SamplingEvaluator
from pipeline.sim.engine import SimEngine
from pipeline.sim.world import SimWorld
from pipeline.tasks.rewards.health import RewardsFailing
from pipeline.tasks.rewards.isolation import check_reward_function
from pipeline.tasks.rewards.scoring import ScoringService
from pipeline.types import Prompt
from railgate.config import load_config

REWARDS = """
import os, time

def boom(prompts, completions, **kw):
    raise ValueError("no field 'answr' in this row")

def none(prompts, completions, **kw):
    return [None] * len(prompts)

def exits(prompts, completions, **kw):
    os._exit(3)

def slow(prompts, completions, **kw):
    time.sleep(30)

def sometimes(prompts, completions, **kw):
    return [None if len(c) % 2 else 1.0 for c in completions]
"""
EXITS_ON_IMPORT = "import os\nos._exit(4)\n"


class Scorer:
    runs_inline = False

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.name = f"test:{behaviour}"

    def __call__(self, prompt, token_ids):
        if self.behaviour == "raise":
            raise KeyError("answer")
        if self.behaviour == "sleep":
            time.sleep(2)
        if self.behaviour == "alternate":
            self.calls = getattr(self, "calls", 0) + 1
            return None if self.calls % 2 else 1.0
        return None if self.behaviour == "none" else 1.0


def _score(service: ScoringService, n: int) -> list[tuple[float, str]]:
    async def run():
        return [await service.score(Prompt(0, "", ()), (1,)) for _ in range(n)]

    return anyio.run(run)


@pytest.mark.parametrize("behaviour, counted", [("raise", "1 raised"), ("none", "1 returned None")])
def test_the_first_rewards_all_failing_stop_with_the_function_and_its_first_failure(behaviour, counted):
    service = ScoringService(Scorer(behaviour), timeout_s=5.0, threads=1, check_first=4)
    with pytest.raises(RewardsFailing, match=f"reward test:{behaviour} failed on each of its first 4 samples") as info:
        _score(service, 10)
    if behaviour == "raise":
        assert "4 raised" in str(info.value) and "the first: KeyError: 'answer'" in str(info.value)
    else:
        assert "4 returned None" in str(info.value) and "return a number" in str(info.value)
    assert counted[:1] and service.health.calls == 4  # counted live, before any learner step


def test_one_good_reward_first_means_no_stop_and_zero_means_never():
    mixed = ScoringService(Scorer("ok"), timeout_s=5.0, threads=1, check_first=2)
    _score(mixed, 1)
    mixed.scorer.behaviour = "raise"
    _score(mixed, 5)
    assert (mixed.errors, mixed.health.ok) == (5, 1)
    never = ScoringService(Scorer("raise"), timeout_s=5.0, threads=1, check_first=0)
    assert [r for r, _ in _score(never, 6)] == [0.0] * 6 and never.errors == 6


def test_timeouts_count_and_name_the_setting():
    service = ScoringService(Scorer("sleep"), timeout_s=0.05, threads=2, check_first=2)
    with pytest.raises(RewardsFailing, match="2 timed out.*raise orchestrator.reward_timeout_s"):
        _score(service, 3)


@pytest.mark.parametrize("key", ["orchestrator.reward_timeout_s", "engine.ray.connect_timeout_s"])
@pytest.mark.parametrize("value", ["1e300", "3601", "0", "-1"])
def test_timeouts_are_bounded_at_config_load(key, value):
    with pytest.raises(ConfigError, match=rf"{key}=.* must be in \(0, 3600\] seconds"):
        load_config(None, [f"{key}={value}"])
    assert load_config(None, [f"{key}=3600"])


def test_held_out_evaluation_reports_reward_failures_and_fails_when_all_did():
    def engine():
        return SimEngine(SimWorld(SimConfig(num_prompts=8, num_eval_prompts=4)))

    prompts = [engine().prompt(i) for i in range(4)]
    scorer = Scorer("ok")
    some = SamplingEvaluator(engine(), prompts, scorer, samples_per_prompt=2, max_tokens=512)

    async def twice():
        scorer.behaviour = "alternate"
        first = await some.evaluate(0)
        scorer.behaviour = "ok"
        return first, await some.evaluate(1)

    result, again = anyio.run(twice)
    assert (result["eval/reward_errors"], result["eval/reward_timeouts"], result["eval/rewards_none"]) == (0, 0, 4)
    assert again["eval/rewards_none"] == 0  # each evaluation's own counts
    timeouts = SamplingEvaluator(
        engine(),
        prompts,
        Scorer("sleep"),
        samples_per_prompt=2,
        max_tokens=512,
        reward_timeout_s=0.05,
        reward_threads=8,
    )
    with pytest.raises(
        RewardsFailing,
        match="held-out evaluation at step 3: reward test:sleep failed on each of all "
        "8 samples .*8 timed out.*raise orchestrator.reward_timeout_s",
    ):
        anyio.run(timeouts.evaluate, 3)


def test_a_reward_module_that_exits_on_import_is_one_config_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "leaves.py").write_text(EXITS_ON_IMPORT)
    with pytest.raises(ConfigError, match="importing module 'leaves' ended its process with exit status 4"):
        check_reward_function("leaves:f")  # this process is still here to say so


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("reward_failures")
    save_tiny_llama(root / "llama", context=64)
    (root / "my_rewards.py").write_text(REWARDS)
    (root / "leaves.py").write_text(EXITS_ON_IMPORT)
    rows = [{"prompt": f"What is {i} + {i + 3}?", "answer": 2 * i + 3} for i in range(40)]
    (root / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return root


def _train(root: Path, run: Path, reward: str, *more: str):
    args = [
        "train",
        "--no-progress",
        "--run-dir",
        str(run),
        *sets(
            f"model.path={root / 'llama'}",
            "task.name=dataset",
            "task.dataset.train_path=rows.jsonl",
            f"task.dataset.reward={reward}",
            "gate.kind=sara",
            "gate.sara.reference_prior=false",
            "orchestrator.steps=3",
            "orchestrator.batch_groups=4",
            "orchestrator.group_size=4",
            "orchestrator.max_tokens=6",
            "data.num_train_prompts=32",
            "data.num_eval_prompts=4",
            "data.eval_samples=2",
            "orchestrator.eval_every=0",
            "orchestrator.max_rollouts=96",
            "log.tensorboard=false",
        ),
    ]
    return cli(*args, *sets(*more), cwd=root, timeout=600)


@pytest.mark.parametrize(
    "reward, first",
    [
        ("my_rewards:boom", "ValueError: no field 'answr' in this row"),
        ("my_rewards:none", "returned None"),
        pytest.param("my_rewards:exits", "worker process ended with exit status 3", marks=pytest.mark.slow),
    ],
)  # a new worker process per reward
def test_a_reward_that_never_works_stops_the_run_with_the_reason(dataset_dir, tmp_path, reward, first):
    """With a skipping gate (SARA) this used to end with rc 0, no learner step, the whole budget
    spent and "errors 0" in the summary."""
    result = _train(dataset_dir, tmp_path / "run", reward, "orchestrator.reward_check_first=8")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    # the held-out evaluation at step 0 meets it first: all of its 8 samples
    assert f"reward {reward} failed on each of all 8 samples" in lines[-1] and first in lines[-1], lines[-1]


def test_without_the_stop_the_summary_counts_failures_even_with_no_step(dataset_dir, tmp_path):
    result = _train(dataset_dir, tmp_path / "run", "my_rewards:boom", "orchestrator.reward_check_first=0")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["budget"]["pipeline/reward_errors"] > 0
    assert summary["budget"]["pipeline/reward_errors"] == summary["budget"]["pipeline/rollouts_finished"]
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"| reward errors / timeouts / none | {int(summary['budget']['pipeline/reward_errors'])} / 0 / 0 |" in report


def test_reward_code_that_exits_on_import_is_one_line_before_anything_is_written(dataset_dir, tmp_path):
    imported = _train(dataset_dir, tmp_path / "imported", "leaves:f")
    lines = imported.stderr.strip().splitlines()
    assert imported.returncode == 2 and len(lines) == 1 and "exit status 4" in lines[0], imported.stderr[-2000:]
    assert not (tmp_path / "imported").exists()


@pytest.mark.slow  # every reward starts a new worker process (the last one ended itself)
def test_reward_code_that_exits_in_a_call_never_takes_the_run_down(dataset_dir, tmp_path):
    """os._exit in a call ends a worker process, not the run."""
    called = _train(
        dataset_dir,
        tmp_path / "called",
        "my_rewards:exits",
        "orchestrator.reward_check_first=0",
        "orchestrator.max_rollouts=16",
    )
    assert called.returncode == 0, called.stderr[-3000:]
    budget = json.loads((tmp_path / "called" / "summary.json").read_text())["budget"]
    assert budget["pipeline/reward_errors"] == budget["pipeline/rollouts_finished"] > 0


def test_a_timeout_that_never_ends_is_refused_before_the_run(dataset_dir, tmp_path):
    result = _train(dataset_dir, tmp_path / "run", "my_rewards:slow", "orchestrator.reward_timeout_s=1e300")
    assert result.returncode == 2 and "reward_timeout_s=1e+300 must be in (0, 3600] seconds" in result.stderr
    assert not (tmp_path / "run").exists()
