"""Start-up cost: reading the configuration and running the simulator never import torch,
transformers or math-verify (together about five seconds on this CPU).

Each check runs in a fresh interpreter, because the other tests in this process import them.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from run_helpers import sets

from railgate.checkpoint import CheckpointWriter, LegacyCheckpointError, load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "math_verify")
REPORT_HEAVY = f"import sys; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"


def python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_run_config_and_the_command_line_import_no_heavy_package():
    result = python(f"import railgate.config, run, pipeline.tasks\n{REPORT_HEAVY}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_old_import_paths_still_give_the_same_classes():
    import pipeline.tasks as tasks
    from pipeline.policy.config import BaseModelConfig as New
    from pipeline.policy.models import BaseModelConfig as Old
    from pipeline.tasks import ArithmeticTask, TaskConfig, build_task
    from pipeline.tasks.arithmetic import ArithmeticTask as Direct

    assert New is Old and ArithmeticTask is Direct
    assert build_task(TaskConfig(name="countdown")).name == "countdown"
    assert all(hasattr(tasks, name) for name in tasks.__all__) and set(tasks.__all__) <= set(dir(tasks))
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        _ = tasks.NoSuchThing


def test_a_simulator_run_imports_no_heavy_package(tmp_path):
    # with tensorboard installed its writer (torch.utils.tensorboard) legitimately needs torch
    tensorboard = [] if importlib.util.find_spec("tensorboard") is None else ["--set", "log.tensorboard=false"]
    argv = [
        "train",
        "--config",
        "configs/sim.yaml",
        "--run-dir",
        str(tmp_path),
        "--no-progress",
        *sets(
            "orchestrator.steps=2",
            "orchestrator.batch_groups=8",
            "orchestrator.group_size=4",
            "sim.num_prompts=256",
            "sim.num_eval_prompts=64",
        ),
        *tensorboard,
    ]
    result = python(f"import sys, run\nassert run.main(sys.argv[1:]) == 0\n{REPORT_HEAVY}", *argv)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"

    # its checkpoint holds no torch tensor: load_checkpoint reads it without importing torch
    checkpoint = tmp_path / "checkpoints" / "step-000002.ckpt"
    loaded = python(
        f"import sys\nfrom railgate.checkpoint import load_checkpoint\n"
        f"print(load_checkpoint({str(checkpoint)!r})['step'])\n{REPORT_HEAVY}"
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == ["2", "[]"]


def test_tensors_round_trip_bit_exactly_and_pickled_checkpoints_are_refused(tmp_path):
    state = {"step": 1, "weights": torch.arange(3.0), "half": torch.tensor([1.5, -0.0], dtype=torch.bfloat16)}
    CheckpointWriter(tmp_path)(state)
    back = load_checkpoint(tmp_path / "checkpoints" / "step-000001.ckpt")
    assert back["step"] == 1 and torch.equal(back["weights"], state["weights"])
    assert back["half"].dtype == torch.bfloat16 and torch.equal(
        back["half"].view(torch.int16), state["half"].view(torch.int16)
    )
    old = tmp_path / "step-000001.pt"
    torch.save(state, old)
    with pytest.raises(LegacyCheckpointError, match="convert-checkpoint"):
        load_checkpoint(old)
