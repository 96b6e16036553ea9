"""replay is honest about its inputs: outcomes join decisions of their own run only, and a
segment given twice (the same path, a copy, a file inside a directory also given) is read once.

Two runs whose decision ids coincide share one trace directory (run b's segments were written
elsewhere and copied in): replaying run a from it must give run a's own estimate, not one with
run b's rewards joined to run a's decisions."""

from __future__ import annotations

import json
import random
import shutil

from pipeline.store.tracelog import TraceLog
from pipeline.types import DecisionRecord
from railgate.cli import main

N = 300


def _write_run(directory, run_id: str, branch_reward: float, seed: int) -> None:
    rng = random.Random(seed)
    with TraceLog(directory, run_id=run_id, flush_every=64) as log:
        for i in range(N):
            chosen = "branch_b2_t1" if rng.random() < 0.5 else "noop"
            log.log_decision(
                DecisionRecord(
                    i,
                    float(i),
                    "",
                    "live",
                    "token",
                    i % 17,
                    i,
                    0,
                    5,
                    {"length_estimate": rng.random()},
                    ("noop", "branch_b2_t1"),
                    chosen,
                    0.5,
                    0.5,
                    0.0,
                    0,
                )
            )
            reward = (branch_reward if chosen != "noop" else 0.0) + rng.gauss(0.0, 0.05)
            log.log_outcome(i, reward=reward, tokens=50)


def _replay(tmp_path, name: str, *args: str) -> dict:
    out = tmp_path / name
    assert main(["replay", *args, "--out", str(out)]) == 0
    return json.loads((out / "offpolicy.json").read_text())


def _estimates(report: dict) -> dict:
    return {(row[0], row[1]): row[2:] for row in report["rows"]}


def test_replay_of_one_run_in_a_shared_directory_matches_the_run_alone(tmp_path, capsys):
    alone, other, shared = tmp_path / "a", tmp_path / "b", tmp_path / "shared"
    _write_run(alone, "a", branch_reward=0.2, seed=1)
    _write_run(other, "b", branch_reward=-0.6, seed=2)
    shutil.copytree(alone, shared)
    for kind in ("decisions", "outcomes"):  # run b's first segment pair, renumbered into the shared directory
        shutil.copy(other / f"{kind}-00000.arrows", shared / f"{kind}-00001.arrows")

    single = _replay(tmp_path, "single", str(alone))
    mixed = _replay(tmp_path, "mixed", str(shared), "--run-id", "a")
    assert mixed["n"] == single["n"] == N
    assert _estimates(mixed) == _estimates(single)
    logged = _estimates(single)[("logged (on-policy)", "mean")][0]
    assert 0.05 < logged < 0.15  # half the decisions branch, at +0.2: run b's -0.6 joined in would show


def test_the_same_segment_given_twice_is_read_once(tmp_path, capsys):
    alone, copy = tmp_path / "a", tmp_path / "copy"
    _write_run(alone, "a", branch_reward=0.2, seed=1)
    shutil.copytree(alone, copy)
    single = _replay(tmp_path, "single", str(alone))
    repeated = _replay(tmp_path, "repeated", str(alone), str(alone), str(copy), str(alone / "decisions-00000.arrows"))
    assert repeated["n"] == single["n"] == N
    assert _estimates(repeated) == _estimates(single)
    assert "Given twice, read once" in (tmp_path / "repeated" / "offpolicy.md").read_text()
