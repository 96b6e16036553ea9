"""Helpers for tests that drive the CLI on small simulator runs: run it in a subprocess, make a
finished run directory, and fingerprint a directory tree (to show a refused command changed
nothing); and for tests that drive the orchestrator in process over built components."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sets(*assignments: str) -> tuple[str, ...]:
    """``--set KEY=VALUE`` for each assignment, as the CLI takes them."""
    return tuple(arg for assignment in assignments for arg in ("--set", assignment))


TORCH_SMALL = (
    "--config",
    "configs/default.yaml",
    "--no-progress",
    *sets(
        "orchestrator.batch_groups=8",
        "data.num_train_prompts=256",
        "data.num_eval_prompts=32",
        "learner.micro_batch=16",
    ),
)
"""A small real-model run: the default config (project GPT-2, torch engine), 8 groups a step."""
SMALL = (
    *sets(
        "orchestrator.batch_groups=8",
        "orchestrator.group_size=4",
        "sim.num_prompts=256",
        "sim.num_eval_prompts=64",
        "log.tensorboard=false",
    ),
    "--no-progress",
)
"""A small simulator run: 8 groups of 4 a step, no TensorBoard, no progress bars."""


def sim_args(command: str, run_dir: Path, steps: int, *more: str) -> list[str]:
    """The arguments of ``COMMAND`` (train, shadow) for a ``SMALL`` simulator run of ``steps``
    steps in ``run_dir``; ``more`` comes last."""
    return [
        command,
        "--config",
        "configs/sim.yaml",
        "--run-dir",
        str(run_dir),
        "--set",
        f"orchestrator.steps={steps}",
        *SMALL,
        *more,
    ]


def run_py(*args: str) -> list[str]:
    """The command line of ``python run.py ARGS``."""
    return [sys.executable, str(ROOT / "run.py"), *args]


def cli_env() -> dict[str, str]:
    """The environment the CLI runs in: this one, with the repository on ``PYTHONPATH``."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def cli_popen(*args: str, **popen) -> subprocess.Popen:
    """``python run.py ARGS`` started in the background (stdout and stderr piped unless
    ``popen`` says otherwise), for tests that act while it runs."""
    options = {"cwd": ROOT, "env": cli_env(), "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
    return subprocess.Popen(run_py(*args), **options)


def cli(*args: str, timeout: int = 240, cwd: Path = ROOT, **popen) -> subprocess.CompletedProcess:
    """``python run.py ARGS`` as a user runs it."""
    return subprocess.run(
        run_py(*args),
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        **popen,
    )


def run_components(comps, cfg, seed: int, gate=None):
    """Run the orchestrator in this process over ``comps`` (``railgate.build.build_components``
    of run config ``cfg``) with ``cfg.orchestrator``: their gate, or ``gate`` (one wrapping it),
    rewards scored with a 5 s timeout by one worker, no evaluation. The run's summary."""
    import dataclasses

    import anyio

    from pipeline.shells.orchestrator import Orchestrator
    from pipeline.tasks.rewards.scoring import ScoringService

    parts = dataclasses.replace(
        comps,
        gate=comps.gate if gate is None else gate,
        scoring=ScoringService(comps.scoring.scorer, 5.0, 1),
        evaluator=None,
        reference=None,
        episodes=None,
    )
    return anyio.run(Orchestrator(parts, cfg.orchestrator, seed=seed).run)


def sim_run(run_dir: Path, steps: int = 3, *overrides: str) -> Path:
    """A finished simulator run in ``run_dir`` with a checkpoint at every step (2 kept)."""
    result = cli(*sim_args("train", run_dir, steps, "--set", "log.checkpoint_every=1", *overrides))
    assert result.returncode == 0, result.stderr
    return run_dir


# A small real model that solves some one-digit sums (held-out accuracy about 0.06): real-model
# tests of evaluation have something to compare, in about a minute on the 2-core machine.
TINY_REAL = (
    *sets(
        "model.d_model=64",
        "task.arithmetic.max_digits=1",
        "model.warm_start_steps=100",
        "model.warm_start_batch=32",
        "data.num_eval_prompts=64",
        "data.num_train_prompts=128",
    ),
)


def tiny_base(out: Path) -> Path:
    """``railgate warm-start --out OUT`` with ``TINY_REAL``: a model directory for ``model.path``."""
    made = cli("warm-start", "--out", str(out), "--no-progress", *TINY_REAL, timeout=900)
    assert made.returncode == 0, made.stderr[-3000:]
    return out


AGENT_SHORT_RUN = (
    "orchestrator.steps=2",
    "orchestrator.batch_groups=2",
    "orchestrator.group_size=4",
    "orchestrator.eval_every=0",
    "data.num_train_prompts=64",
    "data.num_eval_prompts=8",
    "gate.kind=uniform",  # every group trains: an untrained model fails every episode
    "log.checkpoint_every=0",
)
"""``--set`` values of a two-step run of configs/agent.yaml on ``tiny_agent_model``."""


def tiny_agent_model(out: Path) -> Path:
    """An untrained one-layer model for configs/agent.yaml's task, saved for ``model.path``."""
    from configs import CONFIG_DIR
    from pipeline.policy.models import build_model, save_model
    from pipeline.policy.tokenizer import CharTokenizer
    from pipeline.tasks import build_task
    from railgate.config import load_config

    cfg = load_config(CONFIG_DIR / "agent.yaml", [])
    tok = CharTokenizer.for_tasks(build_task(cfg.task))
    model = build_model(tok.vocab_size, d_model=16, n_layers=1, n_heads=2, max_len=cfg.model.max_len, seed=0)
    return save_model(model, tok, out)


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


def cli_ok(*args: str, timeout: int = 240, cwd: Path = ROOT, **popen) -> subprocess.CompletedProcess:
    """``cli(ARGS)`` that must succeed: the end of its stderr is the failure message."""
    result = cli(*args, timeout=timeout, cwd=cwd, **popen)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


PROJECT = ("railgate", "pipeline", "controller", "learner", "configs")
"""The project's top-level packages."""


def run_outside(script: str, cwd: Path, *args: str, timeout: int = 900) -> dict:
    """Run ``script`` (dedented) in a fresh interpreter in ``cwd``, away from the checkout (no
    ``PYTHONPATH``), check that it imported no project module and succeeded; the JSON it
    printed last."""
    guard = (
        f"\nimport sys\nassert not [m for m in sys.modules if m.split('.')[0] in {PROJECT!r}], "
        "'a project module was imported'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script) + guard, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
