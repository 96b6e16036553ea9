"""bench trl's chat tasks and rewards: a marker reward that restating the prompt cannot earn."""

from __future__ import annotations

import pytest

from railgate.bench.trl_rewards import MARKER_INSTRUCTION, marker_reward
from railgate.bench.trl_tasks import arithmetic_questions, word_problems


def test_answer_after_the_marker_earns_the_reward_and_nothing_else_does():
    cases = {
        "Answer: 42": 1.0,
        "answer:42": 1.0,
        "**Answer:** 42": 1.0,
        "6 x 7 = 42. Answer: 42": 1.0,
        "Answer: 41": 0.0,
        "42": 0.0,  # no marker
        "Answer: 1\nAnswer: 42": 0.0,  # only the first marked number counts: guesses do not pay
        "The answer is 42": 0.0,
    }
    got = marker_reward([], list(cases), answer=["42"] * len(cases))
    assert dict(zip(cases, got)) == cases
    chat = [[{"role": "assistant", "content": "Answer: 42"}]]
    assert marker_reward([], chat, answer=["42"]) == [1.0]


@pytest.mark.parametrize("make", [arithmetic_questions, word_problems])
def test_restating_the_prompt_earns_the_last_number_reward_sometimes_and_the_marker_reward_never(make):
    last, marker = make(200, 64, seed=0), make(200, 64, seed=0, reward="marker")
    assert [r["answer"] for r in last.train_rows] == [r["answer"] for r in marker.train_rows]  # same questions

    def restated(task):
        rows = task.train_rows + task.eval_rows
        prompts = [r["prompt"][0]["content"] for r in rows]
        return task.reward(prompts, prompts, answer=[r["answer"] for r in rows])

    assert sum(restated(last)) > 0  # e.g. "What is 4 - 2?": its last number is the answer
    assert sum(restated(marker)) == 0
    for row in marker.train_rows + marker.eval_rows:
        assert row["prompt"][0]["content"].endswith(MARKER_INSTRUCTION)
        assert marker.reward([], [row["reference"]], answer=[row["answer"]]) == [1.0]  # the gate's reference earns it
        assert marker.extract_answer(row["reference"]) == row["answer"]


def test_an_unknown_reward_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"--reward='exact' is not one of last, marker"):
        arithmetic_questions(10, 4, seed=0, reward="exact")


def test_the_marker_reward_is_refused_for_the_cpu_model_before_any_run(tmp_path):
    from run_helpers import cli

    out = cli("bench", "trl", "--model", "cpu", "--reward", "marker", "--out", str(tmp_path / "o"))
    assert out.returncode == 2
    assert "--reward=marker grades the chat tasks of --model=smollm" in out.stderr
    assert not (tmp_path / "o").exists()


def test_mixed_questions_are_seeded_distinct_right_and_held_out_apart_at_every_level():
    from collections import Counter

    from railgate.bench.trl_tasks import mixed_questions

    task = mixed_questions(4096, 64, seed=1)
    assert task.train_rows == mixed_questions(4096, 64, seed=1).train_rows
    assert task.eval_rows != mixed_questions(4096, 64, seed=2).eval_rows
    rows = task.train_rows + task.eval_rows
    texts = [r["prompt"][0]["content"] for r in rows]
    assert len(set(texts)) == len(texts) == 4096 + 64  # held-out questions are never trained on
    for row, text in zip(rows, texts):
        expression = text.removeprefix("What is ").split("?")[0]
        assert eval(expression) == int(row["answer"]) and 0 <= int(row["answer"]) <= 100
        assert len(expression.split()) == 2 * row["operations"] + 1
        assert task.reward([], [f"{expression} = {row['answer']}"], answer=[row["answer"]]) == [1.0]
    assert Counter(r["operations"] for r in task.eval_rows) == {1: 22, 2: 21, 3: 21}
    assert Counter(r["operations"] for r in rows)[1] == 164  # every one-operation question, then the rest
    marked = mixed_questions(30, 6, seed=1, reward="marker")
    assert marked.reward([], [marked.eval_rows[0]["reference"]], answer=[marked.eval_rows[0]["answer"]]) == [1.0]


def test_the_mixed_task_is_a_smollm_task_of_the_command_line():
    from railgate.bench.trl import TASKS, TrlBenchSpec

    assert "mixed" in TASKS["smollm"]
    assert TrlBenchSpec(model="smollm", task="mixed").label == "smollm-mixed"
    with pytest.raises(ValueError, match="--task=mixed is a task of --model=smollm"):
        TrlBenchSpec(model="cpu", task="mixed").check()
