"""The default config's warm start lands on its target, and ``warm-start --out DIR`` writes a base
that ``model.path=DIR`` trains from with no second warm start and the same held-out number."""

from __future__ import annotations

import json
import re

import pytest
from run_helpers import ROOT, cli, cli_ok, sets

from railgate.config import load_config

ACCURACY = re.compile(r"held-out accuracy: (\d\.\d+) \(95% (\d\.\d+) to (\d\.\d+)\) over 512 prompts x 4 samples")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_default_warm_start_lands_within_0_05_of_its_target_and_trains_as_model_path(tmp_path):
    target = load_config(ROOT / "configs/default.yaml").model.warm_start_target
    out = tmp_path / "base"
    made = cli_ok("warm-start", "--out", str(out), "--no-progress", timeout=1500)
    accuracy, lo, hi = map(float, ACCURACY.search(made.stdout).groups())
    assert abs(accuracy - target) <= 0.05 and lo < accuracy < hi
    meta = json.loads((out / "railgate_base.json").read_text())
    assert meta["held_out"]["accuracy"] == accuracy or abs(meta["held_out"]["accuracy"] - accuracy) < 5e-4
    assert meta["warm_start"]["kept_step"] > 0  # the checkpoint kept was chosen near the target

    run = tmp_path / "run"
    trained = cli_ok(
        "train",
        "--no-progress",
        "--run-dir",
        str(run),
        *sets(f"model.path={out}", "orchestrator.steps=1", "log.checkpoint_every=0"),
        timeout=1500,
    )
    assert not (run / "base_model").exists() and "warm start" not in trained.stderr  # no second warm start
    step0 = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert step0["step"] == 0 and step0["eval/accuracy"] == pytest.approx(accuracy, abs=5e-4)  # the same draws


def test_warm_start_refuses_a_users_model_and_a_used_directory(tmp_path):
    refused = cli("warm-start", "--out", str(tmp_path / "x"), "--set", "model.path=/nowhere")
    assert refused.returncode == 2 and "drop --set model.path" in refused.stderr
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "file").write_text("mine")
    used = cli(
        "warm-start",
        "--out",
        str(tmp_path / "used"),
        *sets("model.warm_start_steps=1", "model.warm_start_target=0"),
    )
    assert used.returncode == 2 and "not an empty directory" in used.stderr
    assert (tmp_path / "used" / "file").read_text() == "mine"
