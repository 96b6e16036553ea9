"""Helpers for tests that drive the CLI on small simulator runs: run it in a subprocess, make a
finished run directory, and fingerprint a directory tree (to show a refused command changed
nothing)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH_SMALL = (
    "--config",
    "configs/default.yaml",
    "--no-progress",
    "--set",
    "orchestrator.batch_groups=8",
    "--set",
    "data.num_train_prompts=256",
    "--set",
    "data.num_eval_prompts=32",
    "--set",
    "learner.micro_batch=16",
)
"""A small real-model run: the default config (project GPT-2, torch engine), 8 groups a step."""
SMALL = (
    "--set",
    "orchestrator.batch_groups=8",
    "--set",
    "orchestrator.group_size=4",
    "--set",
    "sim.num_prompts=256",
    "--set",
    "sim.num_eval_prompts=64",
    "--set",
    "log.tensorboard=false",
    "--no-progress",
)


def cli(*args: str, timeout: int = 240, cwd: Path = ROOT, **popen) -> subprocess.CompletedProcess:
    """``python run.py ARGS`` as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **popen,
    )


def sim_run(run_dir: Path, steps: int = 3, *overrides: str) -> Path:
    """A finished simulator run in ``run_dir`` with a checkpoint at every step (2 kept)."""
    result = cli(
        "train",
        "--config",
        "configs/sim.yaml",
        "--run-dir",
        str(run_dir),
        "--set",
        f"orchestrator.steps={steps}",
        "--set",
        "log.checkpoint_every=1",
        *SMALL,
        *overrides,
    )
    assert result.returncode == 0, result.stderr
    return run_dir


# A small real model that solves some one-digit sums (held-out accuracy about 0.06): real-model
# tests of evaluation have something to compare, in about a minute on the 2-core machine.
TINY_REAL = (
    "--set",
    "model.d_model=64",
    "--set",
    "task.arithmetic.max_digits=1",
    "--set",
    "model.warm_start_steps=100",
    "--set",
    "model.warm_start_batch=32",
    "--set",
    "data.num_eval_prompts=64",
    "--set",
    "data.num_train_prompts=128",
)


def tiny_base(out: Path) -> Path:
    """``railgate warm-start --out OUT`` with ``TINY_REAL``: a model directory for ``model.path``."""
    made = cli("warm-start", "--out", str(out), "--no-progress", *TINY_REAL, timeout=900)
    assert made.returncode == 0, made.stderr[-3000:]
    return out


def tree_digest(path: Path) -> dict[str, str]:
    """Every file under ``path`` (relative name -> SHA-256 of its bytes; links by their target)."""
    out = {}
    for p in sorted(Path(path).rglob("*")):
        name = str(p.relative_to(path))
        if p.is_symlink():
            out[name] = "link:" + os.readlink(p)
        elif p.is_file():
            out[name] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_dir():
            out[name] = "dir"
    return out
