"""The figures of ``bench trl``: ratios per seed, and a report written while a seed is running."""

from __future__ import annotations

import pytest

from railgate.bench.trl import RunRecord, TrlBenchSpec
from railgate.bench.trl_report import Point, markdown, summary


def _run(trainer: str, seed: int, accs: list[float], cpu_s: float) -> RunRecord:
    points = [Point(i * 100, 0, float(i), a, 0.02, i) for i, a in enumerate(accs)]
    return RunRecord(trainer, seed, points, 100 * (len(accs) - 1), 0, cpu_s, 0.0, 0.0, len(accs) - 1)


def _seed_1() -> list[RunRecord]:
    """A second seed whose runs never reach start + 0.2."""
    return [_run("grpo", 1, [0.2, 0.25, 0.3, 0.32], 3.0), _run("gated", 1, [0.2, 0.3, 0.35, 0.38], 3.0)]


def test_ratios_are_per_seed_and_a_target_never_reached_is_counted_not_averaged():
    runs = [_run("grpo", 0, [0.3, 0.35, 0.4, 0.5], 3.0), _run("gated", 0, [0.3, 0.4, 0.5, 0.55], 6.0), *_seed_1()]
    s = summary(runs)
    assert s["seeds"] == [0, 1]
    assert s["ratio"]["to_target"]["0.1"] == pytest.approx([0.5, 0.5])
    assert s["ratio"]["to_target"]["0.2"] == pytest.approx([2 / 3])  # seed 1: neither reaches 0.4
    assert s["ratio"]["cpu_per_rollout"] == [2.0, 1.0]
    # CPU-seconds to a target follow each evaluation's training CPU time (here: rollouts / 100)
    assert s["ratio"]["cpu_to_target"]["0.1"] == pytest.approx([0.5, 0.5])
    text = markdown(TrlBenchSpec(), runs, s)
    assert "to start + 0.2 0.67 ± 0.00;" in text
    assert "| grpo | 0.250 ± 0.071 |" in text


def test_a_gated_run_that_ends_past_grpos_budget_is_also_compared_at_grpos_end():
    # the gated run's last step took it to 400 rollouts; GRPO stopped at 300
    runs = [_run("grpo", 0, [0.3, 0.35, 0.4, 0.5], 3.0), _run("gated", 0, [0.3, 0.35, 0.4, 0.45, 0.6], 3.0)]
    s = summary(runs)
    assert s["ratio"]["final_difference"] == pytest.approx([0.1])
    assert s["ratio"]["equal_rollouts_difference"] == pytest.approx([-0.05])
    assert "-0.050 ± 0.000 at equal rollouts" in markdown(TrlBenchSpec(), runs, s)


def test_a_report_written_before_any_seed_has_both_trainers_says_so():
    runs = [_run("grpo", 0, [0.05, 0.06], 297.0)]
    text = markdown(TrlBenchSpec(model="smollm"), runs, summary(runs))
    assert "No seed has run both trainers yet" in text
    assert "not reached (0 of 0)" not in text
    assert "| grpo | 0 | 100 | 1 |" in text  # the run itself is listed


def test_a_c_grpo_peer_run_gets_its_own_row_and_ratios_against_grpo_of_the_same_seed():
    runs = [
        _run("grpo", 0, [0.3, 0.35, 0.4, 0.5], 3.0),
        _run("gated", 0, [0.3, 0.4, 0.5, 0.55], 3.0),
        _run("cgrpo", 0, [0.3, 0.32, 0.36, 0.45], 3.0),
        *_seed_1(),
    ]
    s = summary(runs)
    assert s["cgrpo_seeds"] == [0]
    assert s["ratio_cgrpo"]["to_target"]["0.1"] == pytest.approx([(200 + 100 * 0.04 / 0.09) / 200])
    text = markdown(TrlBenchSpec(), runs, s)
    assert "C-GRPO / GRPO, per seed: rollouts to start + 0.1 1.22 ± 0.00" in text and "(seeds 0)." in text
    assert "| cgrpo | 0 | 300 | 3 |" in text and text.count("| - | - |") >= 1  # no skipped / abandoned counts


def test_a_failing_peer_environment_is_named_with_the_fix(tmp_path):
    from railgate.bench.trl import run_peer

    failing = tmp_path / "python"
    failing.write_text("#!/bin/sh\necho 'No module named trl_cgrpo' >&2\nexit 1\n")
    failing.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"exit 1 under --peer-python=.*pip install -e '\.\[cgrpo-peer\]'"):
        run_peer(0, TrlBenchSpec(peer_python=str(failing)), tmp_path)


def test_a_missing_peer_python_is_refused_before_any_run(tmp_path):
    from run_helpers import cli

    out = cli("bench", "trl", "--peer-python", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert out.returncode == 2
    assert "--peer-python=" in out.stderr and "does not exist; make the peer environment first" in out.stderr
    assert not (tmp_path / "o").exists()


def test_a_task_of_another_model_is_refused_before_any_run(tmp_path):
    from run_helpers import cli

    out = cli("bench", "trl", "--model", "cpu", "--task", "questions", "--out", str(tmp_path / "o"))
    assert out.returncode == 2
    assert "--task=questions is a task of --model=smollm" in out.stderr
    assert not (tmp_path / "o").exists()


def test_arithmetic_questions_are_seeded_distinct_and_right():
    from railgate.bench.trl_tasks import arithmetic_questions

    task = arithmetic_questions(4096, 64, seed=3)
    assert task.train_rows == arithmetic_questions(4096, 64, seed=3).train_rows
    texts = [r["prompt"][0]["content"] for r in task.train_rows + task.eval_rows]
    assert len(set(texts)) == len(texts) == 351  # held-out questions are never trained on
    for row in task.train_rows + task.eval_rows:
        a, op, b = row["prompt"][0]["content"].removeprefix("What is ").split("?")[0].split()
        assert eval(f"{a} {op} {b}") == int(row["answer"]) >= 1
        assert task.reward([], [f"{a} {op} {b} = {row['answer']}"], answer=[row["answer"]]) == [1.0]
    assert len(arithmetic_questions(10, 64, seed=3).train_rows) == 10
    with pytest.raises(ValueError, match="--eval-prompts=351 leaves no training question"):
        arithmetic_questions(10, 351, seed=3)


def _stepped(trainer: str, seed: int, accs: list[float], rollouts_per_step: int) -> RunRecord:
    """A run evaluated after every step, each step costing ``rollouts_per_step``."""
    points = [Point(i * rollouts_per_step, 0, float(i), a, 0.02, i) for i, a in enumerate(accs)]
    n = len(accs) - 1
    return RunRecord(trainer, seed, points, n * rollouts_per_step, 0, 1.0, 0.0, 0.0, n)


def test_gated_minus_grpo_is_paired_by_seed_at_equal_rollouts_and_at_equal_steps_with_a_t_interval():
    # The gated steps cost 1.5x GRPO's rollouts: ahead per step, behind per rollout.
    runs = []
    for seed, lift in enumerate((0.00, 0.02, 0.04)):
        runs.append(_stepped("grpo", seed, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], 64))
        runs.append(_stepped("gated", seed, [0.1, 0.25 + lift, 0.4 + lift, 0.5 + lift, 0.55 + lift], 96))
    r = summary(runs)["ratio"]
    # equal rollouts: both at 384 (GRPO's step 6, the gated run's step 4)
    assert r["equal_rollouts_difference"] == pytest.approx([-0.15, -0.13, -0.11])
    # equal steps: both after step 4
    assert r["equal_steps_difference"] == pytest.approx([0.05, 0.07, 0.09])
    i = r["equal_steps_interval"]
    half = 4.302652729749464 * 0.02 / 3**0.5  # t(0.975, 2) x sd / sqrt(seeds)
    assert (i["mean"], i["lo"], i["hi"], i["n"]) == pytest.approx((0.07, 0.07 - half, 0.07 + half, 3))
    text = markdown(TrlBenchSpec(), runs, summary(runs))
    steps = f"+0.070 (± {half:.3f}: 95% {0.07 - half:+.3f} to {0.07 + half:+.3f}; seeds +0.050, +0.070, +0.090)"
    assert f"at equal optimiser steps {steps}" in text
    assert "at equal rollouts -0.130 (± " in text
    assert "-0.130 ± 0.020 at equal rollouts" in text  # the ratio line keeps its mean ± std


def test_one_seed_gives_its_differences_and_no_interval():
    runs = [_stepped("grpo", 0, [0.1, 0.2, 0.3], 64), _stepped("gated", 0, [0.1, 0.3], 96)]
    s = summary(runs)
    assert s["ratio"]["equal_steps_interval"]["lo"] is None
    assert "at equal optimiser steps +0.100 (one seed: no interval; seeds +0.100)" in markdown(TrlBenchSpec(), runs, s)
