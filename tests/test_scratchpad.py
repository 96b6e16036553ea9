"""Scratchpad tasks: the work, then '>' and the answer; the reward grades the answer only."""

import pytest

from configs import CONFIG_DIR
from pipeline.config.build import ConfigError
from pipeline.policy.tokenizer import CharTokenizer
from pipeline.tasks import ArithmeticTask, CountdownTask, TaskConfig, build_task
from pipeline.tasks.scratchpad import ANSWER_MARK, STEP_SEP, final_answer
from railgate.config import load_config

DEFAULT = CONFIG_DIR / "default.yaml"

SCRATCH = [
    ArithmeticTask(scratchpad=True),
    ArithmeticTask(max_digits=3, padding="none", scratchpad=True),
    CountdownTask(scratchpad=True),
    CountdownTask(ops="+-*/", scratchpad=True),
]
SCRATCH_RUN = ["task.arithmetic.scratchpad=true", "orchestrator.max_tokens=64", "model.max_len=96"]


@pytest.mark.parametrize("task", SCRATCH, ids=repr)
def test_format_round_trip(task):
    """The scratchpad's own form; that reference responses score 1 is tests/test_tasks.py's."""
    tok = CharTokenizer.for_tasks(task)
    for problem in task.train_problems(300, seed=2):
        target = task.sft_example(problem)[1]
        steps, answer = target.rsplit(ANSWER_MARK, 1)
        assert final_answer(target) == answer
        assert all("=" in step for step in steps.split(STEP_SEP))  # the work is there: one equation a step
        assert tok.decode(tok.encode_response(target)) == target
        assert task.score(task.to_prompt(problem, tok.encode_prompt), steps) == 0.0  # no answer written: 0


def test_arithmetic_steps_are_the_carries_and_the_answer_follows():
    task = ArithmeticTask(scratchpad=True)
    problem = task.make_problem(9987, "+", 45)
    steps, answer = problem.solution.split(ANSWER_MARK)
    assert steps.split(STEP_SEP) == ["7+5+0=12", "8+4+1=13", "9+0+1=10", "9+0+1=10", "0+0+1=01"]
    assert answer == problem.answer == "23001"  # 10032 reversed
    assert task.sft_example(problem)[0] == "09987+00045="
    for p in task.train_problems(500, seed=0):  # one fixed-width step per padded digit position
        assert [len(s) for s in p.solution.split(ANSWER_MARK)[0].split(STEP_SEP)] == [8] * 5


def test_countdown_steps_are_the_reference_fold():
    task = CountdownTask(scratchpad=True)
    for p in task.train_problems(300, seed=0):
        steps, expr = p.solution.split(ANSWER_MARK)
        assert steps.count("=") == int(p.difficulty) - 1
        target = p.answer.split("->")[1]
        assert steps.split(STEP_SEP)[-1].endswith("=" + target)
        assert task.score(task.to_prompt(p), ANSWER_MARK + expr) == 1.0


@pytest.mark.parametrize("task", SCRATCH, ids=repr)
def test_reward_grades_only_the_final_answer(task):
    tok = CharTokenizer.for_tasks(task)
    problem = task.train_problems(1, seed=5)[0]
    prompt = task.to_prompt(problem, tok.encode_prompt)
    steps, answer = problem.solution.rsplit(ANSWER_MARK, 1)
    wrong_steps = steps.replace("1", "7").replace("2", "1")  # every step wrong, or at least changed
    wrong_answer = "9" + answer if task.name == "arithmetic" else answer + "+1"
    for text, expected in [
        (f"{wrong_steps}{ANSWER_MARK}{answer}", 1.0),
        (f"{ANSWER_MARK}{answer}", 1.0),
        (f"{steps}{ANSWER_MARK}{wrong_answer}", 0.0),
        (answer, 0.0),
        (f"{steps}{ANSWER_MARK}{wrong_answer}{ANSWER_MARK}{answer}", 1.0),
    ]:
        assert task.score(prompt, text) == expected, text
        assert task.scorer(tok.decode)(prompt, tok.encode(text)) == expected, text


def test_a_wrong_intermediate_step_with_the_right_answer_scores_one():
    task = ArithmeticTask(scratchpad=True)
    prompt = task.to_prompt(task.make_problem(37, "+", 415))
    assert task.score(prompt, "7+5+0=13,3+1+1=05,0+4+0=04,0+0+0=00,0+0+0=00>254") == 1.0
    assert task.score(prompt, "7+5+0=12,3+1+1=05,0+4+0=04,0+0+0=00,0+0+0=00>354") == 0.0


def test_prompts_and_targets_fit_the_context_the_config_asks_for():
    cfg = load_config(DEFAULT, SCRATCH_RUN)
    task = build_task(cfg.task)
    tok = CharTokenizer.for_tasks(task)
    longest = 0
    for problem in task.train_problems(3000, seed=0):
        prompt_text, target = task.sft_example(problem)
        response = len(tok.encode_response(target))
        assert response <= cfg.orchestrator.max_tokens
        assert len(tok.encode_prompt(prompt_text)) + cfg.orchestrator.max_tokens <= cfg.model.max_len
        longest = max(longest, response)
    assert longest == cfg.task.arithmetic.response_tokens == task.sample_tokens == 52


def test_countdown_scratchpad_targets_fit_64_tokens():
    task = CountdownTask(scratchpad=True)
    tok = CharTokenizer.for_tasks(task)
    worst = max(
        len(tok.encode_prompt(a)) + len(tok.encode_response(b))
        for a, b in map(task.sft_example, task.train_problems(5000, seed=0))
    )
    assert worst <= 64 + 1  # prompt + response: max_len 96 with max_tokens 64 leaves room


def test_lengths_follow_the_task_unless_the_config_gives_them():
    assert (load_config(DEFAULT).orchestrator.max_tokens, load_config(DEFAULT).model.max_len) == (16, 64)
    cfg = load_config(DEFAULT, ["task.arithmetic.scratchpad=true"])
    assert (cfg.orchestrator.max_tokens, cfg.model.max_len) == (64, 96) == cfg.task.lengths(64)
    cfg = load_config(DEFAULT, ["task.arithmetic.scratchpad=true", "task.arithmetic.max_digits=3"])
    assert (cfg.orchestrator.max_tokens, cfg.model.max_len) == (44, 64)  # 32-token responses, 9-token prompts
    cfg = load_config(DEFAULT, ["task.arithmetic.scratchpad=true", "model.max_len=128"])
    assert (cfg.orchestrator.max_tokens, cfg.model.max_len) == (64, 128)  # a given value is kept
    assert load_config(DEFAULT, ["engine.kind=sim", "task.arithmetic.scratchpad=true"]).orchestrator.max_tokens == 256


def test_config_refuses_a_scratchpad_that_does_not_fit_and_other_ops():
    with pytest.raises(
        ConfigError,
        match=r"up to 52 tokens.*max_tokens=16; set orchestrator.max_tokens=64 and "
        r"model.max_len=96 or more, or leave both out",
    ):
        load_config(DEFAULT, ["task.arithmetic.scratchpad=true", "orchestrator.max_tokens=16"])
    with pytest.raises(ConfigError, match="ops='\\+-' must be '\\+'"):
        load_config(DEFAULT, SCRATCH_RUN + ["task.arithmetic.ops=+-"])
    cfg = load_config(DEFAULT, SCRATCH_RUN + ["task.name=countdown", "task.countdown.scratchpad=true"])
    assert build_task(cfg.task).scratchpad


def test_default_is_unchanged():
    """scratchpad=false: the same prompts, targets, alphabet and reward as before the option."""
    task = build_task(TaskConfig())
    assert not task.scratchpad and task.sample_tokens == 32
    assert task.alphabet == "0123456789=+"
    assert task.sft_example(task.make_problem(37, "+", 415)) == ("00037+00415=", "254")
    assert task.score(task.to_prompt(task.make_problem(37, "+", 415)), ">254") == 0.0
    assert CountdownTask().alphabet == "0123456789+-*/() to:"
    assert repr(ArithmeticTask()).endswith("padding='max')")
