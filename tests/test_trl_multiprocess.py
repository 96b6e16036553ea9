"""GatedGRPOTrainer under ``accelerate launch --multi_gpu --num_processes 2`` on CPU (torchrun, gloo;
``use_cpu=True`` in the config; ``--cpu`` alone starts one process here): the gate runs on
every process on the gathered probes, so it decides as one process does for the same global
batch; a group whose probe lands on two processes is judged whole; processes that would decide
differently stop the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from trl_fixtures import model_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "trl_launch.py"
pytestmark = pytest.mark.slow


def launch(scenario: str, processes: int, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / f"{scenario}-{processes}"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        str(processes),
        *(["--multi_gpu"] if processes > 1 else ["--cpu"]),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(SCRIPT),
        scenario,
        str(out),
        model_dir(tmp_path),
    ]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900), out


def ranks(out: Path, processes: int) -> list[dict]:
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(processes)]


def test_two_processes_make_one_processs_gate_decisions(tmp_path):
    one, out1 = launch("hora", 1, tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    two, out2 = launch("hora", 2, tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    (single,), (rank0, rank1) = ranks(out1, 1), ranks(out2, 2)
    assert rank0["steps"] == rank1["steps"] == single["steps"]
    sizes = {size for step in single["steps"] for _, size, _ in step}
    assert len(single["steps"]) == 3 and len(sizes) > 1  # HORA's extras went to some prompts: variable groups
    assert rank0["metrics"]["railgate/rollouts_generated"] == single["metrics"]["railgate/rollouts_generated"] == 3 * 14


def test_a_probe_split_over_two_processes_is_judged_whole(tmp_path):
    two, out = launch("split", 2, tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    rank0, rank1 = ranks(out, 2)
    assert rank0["steps"] == rank1["steps"]
    trained = [g for step in rank0["steps"] for g in step]
    # Process 0 scores 1, process 1 scores 0: only a group whose rows sit on both is mixed, and
    # only the gathered group shows it (each process alone sees an all-same probe).
    assert len(trained) == 9 and all(0.0 in rewards and 1.0 in rewards for _, _, rewards in trained)


def test_processes_that_would_decide_differently_stop_the_run(tmp_path):
    two, _ = launch("disagree", 2, tmp_path)
    assert two.returncode != 0
    assert "the gate's decisions differ across processes at step 0" in two.stderr
