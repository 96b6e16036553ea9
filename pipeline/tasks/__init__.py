"""Real tasks: problem sources with a prompt template, a reward and warm-start examples.

=================  ===========================================================
``arithmetic``     multi-digit addition (and - *), answers written backwards
``countdown``      reach a target from 2-4 numbers; safe expression checker
``dataset``        JSONL / Parquet rows (prompt/answer fields configurable)
``env``            multi-turn episodes against an environment (``pipeline.envs``)
=================  ===========================================================

>>> task = build_task(TaskConfig(name="arithmetic"))
>>> prompts = task.train_prompts(3, seed=0)
>>> [p.difficulty for p in prompts] == [p.difficulty for p in task.train_prompts(3, seed=0)]
True
"""

from __future__ import annotations

from dataclasses import asdict
from importlib import import_module
from typing import TYPE_CHECKING, Any

# The settings classes are cheap and eager: the run configuration composes them. The task
# classes are loaded on first use, because their rewards import math-verify (about a second),
# which a simulator run or a config check never needs.
from pipeline.tasks.config import ArithmeticConfig, CountdownConfig, DatasetConfig, TaskConfig

if TYPE_CHECKING:
    from pipeline.datafiles import DatasetError, LoadReport
    from pipeline.tasks.arithmetic import ArithmeticTask
    from pipeline.tasks.base import Problem, Task, stable_hash
    from pipeline.tasks.countdown import CountdownTask
    from pipeline.tasks.dataset import DatasetTask, load_problems
    from pipeline.tasks.env import EnvTask

_LAZY = {
    "ArithmeticTask": "arithmetic",
    "CountdownTask": "countdown",
    "DatasetError": "pipeline.datafiles",
    "DatasetTask": "dataset",
    "EnvTask": "env",
    "LoadReport": "pipeline.datafiles",
    "load_problems": "dataset",
    "Problem": "base",
    "Task": "base",
    "stable_hash": "base",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    where = _LAZY[name]  # a module of this package, or a dotted module path
    value = getattr(import_module(where if "." in where else f"{__name__}.{where}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def build_task(cfg: TaskConfig, context_chars: int = 0) -> Task:
    """The task ``cfg`` describes. ``context_chars`` > 0: dataset rows whose prompt has more
    characters than that cannot fit the model's context, and are bad rows (checked as the file
    is read, before any is tokenized)."""
    from pipeline.tasks.arithmetic import ArithmeticTask
    from pipeline.tasks.countdown import CountdownTask
    from pipeline.tasks.dataset import DatasetTask

    task: Task
    if cfg.name == "arithmetic":
        task = ArithmeticTask(**asdict(cfg.arithmetic), eval_share=cfg.eval_share)
    elif cfg.name == "countdown":
        task = CountdownTask(**asdict(cfg.countdown), eval_share=cfg.eval_share)
    elif cfg.name == "dataset":
        task = DatasetTask(**asdict(cfg.dataset), eval_share=cfg.eval_share, context_chars=context_chars)
    elif cfg.name == "env":
        from pipeline.tasks.env import EnvTask

        task = EnvTask(cfg.env, eval_share=cfg.eval_share)
    else:
        raise ValueError(f"task.name={cfg.name!r} is unknown; choose arithmetic, countdown, dataset or env")
    task.success_threshold = cfg.success_threshold
    return task


__all__ = [
    "ArithmeticConfig",
    "ArithmeticTask",
    "CountdownConfig",
    "CountdownTask",
    "DatasetConfig",
    "DatasetError",
    "DatasetTask",
    "EnvTask",
    "LoadReport",
    "Problem",
    "Task",
    "TaskConfig",
    "build_task",
    "load_problems",
    "stable_hash",
]
