"""``python run.py bench allocation|rail`` end to end on the simulator, small, as a user runs it."""

from __future__ import annotations

import json
import subprocess

from run_helpers import cli, sets


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return cli(*args, timeout=timeout)


def test_bench_rail_writes_tables_runs_and_plot(tmp_path):
    result = run(
        "bench",
        "rail",
        "--policies",
        "uniform,sara,sara_rail,oracle",
        "--seeds",
        "1",
        "--budget",
        "1200",
        "--models",
        "effective",
        "--workers",
        "1",
        "--target-gain",
        "0.005",
        "--out",
        str(tmp_path),
        *sets("orchestrator.batch_groups=8", "controller.rail.cost_lambda=0.5"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads((tmp_path / "allocation.json").read_text())
    assert sorted(r["policy"] for r in runs) == ["oracle", "sara", "sara_rail", "uniform"]
    for r in runs:
        counted = r["curve"][-1][0]
        assert 1200 <= counted < 1200 + 3 * 8 * 8, (r["policy"], counted)  # the equal budget, counted
        assert r["curve"][0][3] == runs[0]["curve"][0][3]  # every policy starts from the same world
    rail = next(r for r in runs if r["policy"] == "sara_rail")
    assert rail["controller"]["controller/decisions"] > 0
    sara = next(r for r in runs if r["policy"] == "sara")
    assert sara["gate"]["gate/abandon"] > 0 and sara["gate"]["gate/commit"] > 0  # the gate's verdicts, counted
    text = (tmp_path / "allocation.md").read_text()
    assert "controller.rail.cost_lambda=0.5" in text and "| sara_rail |" in text and "recovered (all-fail)" in text
    assert (tmp_path / "allocation.png").read_bytes().startswith(b"\x89PNG")


def test_first_seed_adds_later_seeds_and_says_which(tmp_path):
    result = run(
        "bench",
        "allocation",
        "--policies",
        "uniform",
        "--seeds",
        "2",
        "--first-seed",
        "3",
        "--budget",
        "256",
        "--models",
        "effective",
        "--workers",
        "1",
        "--out",
        str(tmp_path),
        "--set",
        "orchestrator.batch_groups=8",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(r["seed"] for r in json.loads((tmp_path / "allocation.json").read_text())) == [3, 4]
    assert "2 seeds (3 to 4)" in (tmp_path / "allocation.md").read_text()
    negative = run("bench", "allocation", "--first-seed", "-1", "--out", str(tmp_path))
    assert negative.returncode == 2 and "--first-seed=-1 must be >= 0" in negative.stderr


def test_bench_with_a_bad_override_or_policy_is_a_clear_error(tmp_path):
    bad_key = run("bench", "rail", "--set", "controller.rail.cost_lamda=1", "--out", str(tmp_path))
    assert bad_key.returncode == 2 and "cost_lamda" in bad_key.stderr
    bad_policy = run("bench", "allocation", "--policies", "sara,nope", "--out", str(tmp_path))
    assert bad_policy.returncode == 2 and "unknown policy 'nope'" in bad_policy.stderr
