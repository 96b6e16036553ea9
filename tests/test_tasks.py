"""Tasks: seeded, disjoint train/eval splits, correct reference solutions, dataset loading."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config.build import ConfigError, build
from pipeline.policy.tokenizer import CharTokenizer
from pipeline.tasks import (
    ArithmeticTask,
    CountdownTask,
    DatasetError,
    DatasetTask,
    TaskConfig,
    build_task,
)

GENERATED = [ArithmeticTask(), ArithmeticTask(ops="+-*", max_digits=3), CountdownTask(), CountdownTask(ops="+-*/")]


@pytest.mark.parametrize("task", GENERATED, ids=repr)
def test_train_and_eval_are_disjoint_and_seeded(task):
    train = task.train_prompts(2000, seed=0)
    evals = task.eval_prompts(300, seed=0) + task.eval_prompts(300, seed=1)
    assert {p.text for p in train}.isdisjoint({p.text for p in evals})
    assert {p.prompt_id for p in train}.isdisjoint({p.prompt_id for p in evals})
    assert [p.text for p in task.train_prompts(50, seed=3)] == [p.text for p in task.train_prompts(50, seed=3)]
    assert [p.text for p in task.train_prompts(50, seed=3)] != [p.text for p in task.train_prompts(50, seed=4)]


@pytest.mark.parametrize(
    "task", GENERATED + [ArithmeticTask(scratchpad=True), CountdownTask(ops="+-*/", scratchpad=True)], ids=repr
)
def test_reference_solutions_score_one_and_prompts_are_encodable(task):
    tok = CharTokenizer.for_tasks(task)
    for problem in task.train_problems(300, seed=1):
        prompt_text, target = task.sft_example(problem)
        prompt = task.to_prompt(problem, tok.encode_prompt)
        assert prompt.text == prompt_text and prompt.answer == problem.answer
        assert task.score(prompt, target) == 1.0
        assert task.scorer(tok.decode)(prompt, tok.encode_response(target)) == 1.0
        assert task.score(prompt, target + "9") == 0.0
        assert prompt.token_ids[0] == tok.bos_id and tok.decode(prompt.token_ids) == prompt_text


def test_arithmetic_answers_are_reversed_and_difficulty_is_digits():
    task = ArithmeticTask(min_digits=1, max_digits=5)
    assert task.sft_example(task.make_problem(37, "+", 415)) == ("00037+00415=", "254")
    assert ArithmeticTask(padding="pair").make_problem(37, "+", 415).text == "037+415"
    assert task.make_problem(99, "*", 9).answer == "198"  # 891 reversed
    assert ArithmeticTask(reverse_answer=False).make_problem(37, "+", 415).answer == "452"
    problems = task.train_problems(3000, seed=0)
    assert {p.difficulty for p in problems} == {1.0, 2.0, 3.0, 4.0, 5.0}
    for p in problems[:200]:
        a, b = p.text.split("+")
        assert len(a) == len(b) == 5 and str(int(a) + int(b))[::-1] == p.answer
        assert p.difficulty == max(len(str(int(a))), len(str(int(b))))
    sub = ArithmeticTask(ops="-").train_problems(200, seed=0)
    assert all(not p.answer.endswith("-") for p in sub)  # larger operand first: no negatives


def test_countdown_problems_are_solvable_and_within_range():
    task = CountdownTask(min_numbers=2, max_numbers=4, max_number=20, max_target=200)
    problems = task.train_problems(1000, seed=0)
    assert {p.difficulty for p in problems} == {2.0, 3.0, 4.0}
    for p in problems:
        nums = [int(x) for x in p.text.split(" to ")[0].split()]
        target = int(p.text.split(" to ")[1])
        assert 1 <= target <= 200 and all(1 <= n <= 20 for n in nums)
        assert len(nums) == p.difficulty
    assert task.format_prompt(problems[0]).endswith(":")


def test_unique_draws_and_a_too_small_space_raise_clearly():
    task = ArithmeticTask(min_digits=1, max_digits=1)
    evals = task.eval_prompts(5, seed=0, unique=True)
    assert len({p.text for p in evals}) == 5
    with pytest.raises(ValueError, match="problem space is too small"):
        task.eval_prompts(50, seed=0, unique=True)


def test_invalid_settings_name_the_fix():
    with pytest.raises(ValueError, match="min_digits <= max_digits"):
        ArithmeticTask(min_digits=4, max_digits=2)
    with pytest.raises(ValueError, match="subset of"):
        ArithmeticTask(ops="+^")
    with pytest.raises(ValueError, match="2 <= min_numbers"):
        CountdownTask(min_numbers=1)
    with pytest.raises(ValueError, match="eval_share"):
        CountdownTask(eval_share=0)


def test_task_config_builds_each_task(tmp_path):
    assert isinstance(
        build_task(build(TaskConfig, {"name": "countdown", "countdown": {"max_numbers": 3}})), CountdownTask
    )
    task = build_task(build(TaskConfig, {"arithmetic": {"max_digits": 3, "ops": "+-"}}))
    assert isinstance(task, ArithmeticTask) and task.max_digits == 3 and task.ops == "+-"
    with pytest.raises(ConfigError, match="needs task.dataset.train_path"):
        build(TaskConfig, {"name": "dataset"})
    with pytest.raises(ConfigError, match="unknown key 'task.arithmetic.digits'"):
        build(TaskConfig, {"arithmetic": {"digits": 3}}, "task")


# -- datasets -------------------------------------------------------------------------------

ROWS = [{"problem": f"What is {i} + {i}?", "solution": f"\\boxed{{{2 * i}}}", "level": i % 5} for i in range(60)]


def write_jsonl(path, rows, extra_lines=()):
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_and_parquet_load_the_same_problems(tmp_path):
    jsonl = write_jsonl(tmp_path / "d.jsonl", ROWS)
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    kw = dict(prompt_field="problem", answer_field="solution", difficulty_field="level")
    a, b = DatasetTask(jsonl, **kw), DatasetTask(parquet, **kw)
    assert [p.text for p in a.train_prompts(20, seed=0)] == [p.text for p in b.train_prompts(20, seed=0)]
    assert a.load_report.rows == 60 and a.load_report.skipped == 0
    p = a.eval_prompts(1, seed=0)[0]
    assert a.score(p, "it is \\boxed{" + p.answer[7:-1] + "}") == 1.0
    assert {p.difficulty for p in a.train_prompts(100, seed=0)} <= {0.0, 1.0, 2.0, 3.0, 4.0}


def test_dataset_splits_are_disjoint_and_cover_the_rows(tmp_path):
    task = DatasetTask(
        write_jsonl(tmp_path / "d.jsonl", ROWS), prompt_field="problem", answer_field="solution", eval_share=0.25
    )
    train = {p.text for p in task.train_prompts(500, seed=0)}
    evals = {p.text for p in task.eval_prompts(100, seed=0)}
    assert train.isdisjoint(evals) and len(train | evals) == 60 and evals
    with pytest.raises(DatasetError, match="distinct eval rows"):
        task.eval_prompts(61, seed=0, unique=True)


def test_separate_eval_file_drops_overlap_from_training(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    held = write_jsonl(tmp_path / "eval.jsonl", ROWS[:5])
    task = DatasetTask(train, eval_path=held, prompt_field="problem", answer_field="solution")
    assert task.dropped_overlap == 5
    assert {p.text for p in task.eval_prompts(5, seed=0, unique=True)} == {r["problem"] for r in ROWS[:5]}
    assert not {p.text for p in task.train_prompts(300, seed=0)} & {r["problem"] for r in ROWS[:5]}


BAD_LINES = [
    json.dumps({"solution": "1"}),  # missing prompt
    json.dumps({"problem": 7, "solution": "1"}),  # a prompt neither text nor chat messages (answers may be any JSON)
    json.dumps({"problem": "   ", "solution": "1"}),  # empty prompt
    json.dumps({"problem": "x" * 500, "solution": "1"}),  # too long
    "{broken json",
    json.dumps([1, 2]),
]


def test_bad_rows_are_skipped_and_counted(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS, BAD_LINES)
    task = DatasetTask(path, prompt_field="problem", answer_field="solution", max_prompt_chars=100)
    report = task.load_report
    assert report.rows == 60 and report.skipped == len(BAD_LINES)
    assert sum(report.reasons.values()) == len(BAD_LINES)
    assert any("missing" in r for r in report.reasons) and any("neither text nor" in r for r in report.reasons)


@pytest.mark.parametrize(
    "line, message",
    [
        (BAD_LINES[0], r"line 61: field 'problem' is missing \(keys: solution\)"),
        (BAD_LINES[1], r"line 61: field 'problem' is neither text nor a list of chat messages \(int 7\)"),
        (BAD_LINES[2], r"line 61: field 'problem' is empty"),
        (BAD_LINES[3], r"line 61: prompt is longer than max_prompt_chars=100"),
        (BAD_LINES[4], r"line 61: invalid JSON"),
    ],
)
def test_bad_row_error_names_file_row_and_fix(tmp_path, line, message):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS, [line])
    with pytest.raises(DatasetError, match=message) as info:
        DatasetTask(path, prompt_field="problem", answer_field="solution", on_bad_row="error", max_prompt_chars=100)
    assert str(path) in str(info.value) and "on_bad_row='skip'" in str(info.value)


def test_parquet_bad_rows_and_missing_columns(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS + [{"problem": None, "solution": "1", "level": 0}]), path)
    with pytest.raises(DatasetError, match=r"row 61: field 'problem' is missing"):
        DatasetTask(path, prompt_field="problem", answer_field="solution", on_bad_row="error")
    assert DatasetTask(path, prompt_field="problem", answer_field="solution").load_report.skipped == 1
    with pytest.raises(DatasetError, match=r"has no column 'question' \(columns: problem, solution, level\)"):
        DatasetTask(path, prompt_field="question", answer_field="solution")


def test_unusable_files_raise_clearly(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        DatasetTask(tmp_path / "nope.jsonl")
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match="unknown file type '.csv'"):
        DatasetTask(tmp_path / "d.csv")
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(DatasetError, match="no usable rows .*field 'prompt' is missing"):
        DatasetTask(path)  # default field names do not match this file
    with pytest.raises(ValueError, match="must contain '\\{prompt\\}'"):
        DatasetTask(path, prompt_field="problem", answer_field="solution", template="Solve:")


def test_template_keeps_latex_braces(tmp_path):
    rows = [{"q": "Simplify \\frac{2}{4}", "a": "\\frac{1}{2}"}] * 3 + [{"q": f"q{i}", "a": "1"} for i in range(30)]
    task = DatasetTask(
        write_jsonl(tmp_path / "d.jsonl", rows),
        prompt_field="q",
        answer_field="a",
        template="Problem: {prompt}\nAnswer:",
        reward="exact",
    )
    texts = {p.text for p in task.train_prompts(200, seed=0) + task.eval_prompts(50, seed=0)}
    assert "Problem: Simplify \\frac{2}{4}\nAnswer:" in texts


def test_arithmetic_in_words_keeps_the_split_and_grades_the_last_number():
    """A template changes what the model reads, not which problems are held out."""
    words = ArithmeticTask(
        max_digits=2,
        reverse_answer=False,
        padding="none",
        template="What is {a} {op} {b}? Answer with the number only.",
        reward="numeric",
    )
    compact = ArithmeticTask(max_digits=2, reverse_answer=False, padding="none")
    pw, pc = words.eval_prompts(20, seed=0), compact.eval_prompts(20, seed=0)
    assert [p.prompt_id for p in pw] == [p.prompt_id for p in pc] and [p.answer for p in pw] == [p.answer for p in pc]
    assert all(p.text.startswith("What is ") and p.text.endswith("number only.") for p in pw)
    p = pw[0]
    assert words.score(p, f"1 + 1 = {p.answer}") == 1.0 and compact.score(p, f"1 + 1 = {p.answer}") == 0.0
    assert words.score(p, f"{p.answer} or 1") == 0.0  # the last number counts
    with pytest.raises(ConfigError, match=r"may hold only the fields \{a\}, \{op\} and \{b\}"):
        build(TaskConfig, {"arithmetic": {"template": "What is {x}?"}})
