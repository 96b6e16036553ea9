"""examples/sara_in_your_loop.py runs on a tiny model, and the driver it uses keeps the gate's
lifecycle: a report after a group ended, or of more samples than asked for, raises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hf_models import save_tiny_llama

from controller.driver import GateDriver, LifecycleError, Verdict

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "sara_in_your_loop.py"


def test_the_example_runs_under_60_lines(tmp_path):
    assert len(EXAMPLE.read_text().splitlines()) < 60
    model = save_tiny_llama(tmp_path / "llama")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), str(model)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    verdicts = [line for line in result.stdout.splitlines() if line.startswith("'")]
    assert len(verdicts) == 4 and all(": train after " in v or ": drop after " in v for v in verdicts)
    assert "lifecycle error, as it should be" in result.stdout


def test_a_report_after_commit_raises_instead_of_counting_twice():
    driver = GateDriver.sara(group_size=4, probe_size=2)
    group = driver.open("p", prompt_id=5)
    assert group.start().n == 2
    assert group.report([1.0, 0.0]).kind == "sample"  # committed: the rest of the group
    with pytest.raises(LifecycleError, match="only 2 samples are out"):
        group.report([1.0, 1.0, 1.0])
    assert group.report([0.0, 1.0]).kind == "train" and group.rewards == [1.0, 0.0, 0.0, 1.0]
    with pytest.raises(LifecycleError, match="ended"):
        group.report([1.0])
    driver.step_done([group])
    assert driver.step == 1


def test_all_same_probe_is_dropped_and_none_is_no_reward():
    driver = GateDriver.sara(group_size=8, probe_size=4)
    group = driver.open("p", prompt_id=1)
    group.start()
    assert group.report([0.0, None]).kind == "wait"  # two samples still out; None counted as failed
    assert group.report([0.0, 0.0]).kind in ("sample", "drop")
    dropped = driver.open("q", prompt_id=2)
    dropped.start()
    assert dropped.report([1.0, 1.0, 1.0, 1.0]).kind == "drop"
    with pytest.raises(LifecycleError, match="not committed"):
        driver.step_done([dropped])


def test_shaped_rewards_read_against_the_threshold():
    driver = GateDriver.sara(group_size=4, probe_size=2, success_threshold=1.5)
    group = driver.open("p", prompt_id=1)
    group.start()
    assert group.report([1.0, 1.0]).kind == "drop"  # both below 1.5: all failures
    mixed = driver.open("q", prompt_id=2)
    mixed.start()
    assert mixed.report([2.0, 1.0]) == Verdict("sample", 2)  # one above 1.5, one below: mixed, so the rest
    assert mixed.report([2.0, 1.0]).kind == "train"
