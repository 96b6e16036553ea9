"""A run directory is data, never instructions: the settings its ``config.yaml`` may not give.

Users share run directories, and evaluate or resume ones they downloaded. Most of a run's
configuration only shapes numbers, but a few settings make railgate run a program, import code
or reach a host. Those (``UNTRUSTED``) are not taken from a run directory's ``config.yaml``:
``eval RUN_DIR`` and ``train --resume RUN_DIR`` refuse a run whose file sets one to anything but
its default, unless the same command passes it with ``--set`` -- then it is the user's own
instruction, given in that call. (VW's options are in addition held to an allow-list wherever
they come from: ``controller.rail.vw_args``.)

Paths a run reads (``model.path``, dataset files) stay readable from a run directory: reading a
model's safetensors, a tokenizer or a JSONL runs no code (``trust_remote_code`` is never set).

>>> import pathlib, tempfile
>>> run = pathlib.Path(tempfile.mkdtemp())
>>> _ = (run / "config.yaml").write_text("controller:\\n  rail:\\n    vw_extra_args: --l2 1e-6\\n")
>>> run_dir_config(run, [], "eval").controller.rail.vw_extra_args  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pipeline.config.build.ConfigError: .../config.yaml sets controller.rail.vw_extra_args='--l2 1e-6', which reaches vowpalwabbit's command line; ...
>>> run_dir_config(run, ["controller.rail.vw_extra_args=--l2 1e-6"], "eval").controller.rail.vw_extra_args
'--l2 1e-6'
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from pipeline.config.build import ConfigError, load_yaml, shorten
from pipeline.tasks.rewards.user import is_user_reward
from railgate.config import RunConfig, load_config

UNTRUSTED: dict[str, str] = {
    "controller.rail.vw_extra_args": "reaches vowpalwabbit's command line",
    "task.dataset.reward": "names Python code to import and run",
    "task.env.class": "names Python code to import and run",
    "engine.ray.address": "connects to a Ray cluster",
}
"""Keys a run directory's ``config.yaml`` may not set (to a non-default value), and why."""


def run_dir_config(run_dir: str | Path, overrides: list[str], command: str) -> RunConfig:
    """The config of ``run_dir`` (its ``config.yaml`` plus ``overrides``), refused with a
    ``ConfigError`` when the file sets an ``UNTRUSTED`` key that ``overrides`` do not."""
    path = Path(run_dir) / "config.yaml"
    check_run_dir_settings(path, overrides, command)
    return load_config(path, list(overrides))


def check_run_dir_settings(path: Path, overrides: list[str], command: str) -> None:
    """``ConfigError`` naming the first ``UNTRUSTED`` setting of ``path`` not given in ``overrides``."""
    stored = load_yaml(path)
    given = {item.split("=", 1)[0].strip() for item in overrides if "=" in item}
    for key, why in UNTRUSTED.items():
        value = _lookup(stored, key)
        if value in (None, "") or key in given or not _untrusted_value(key, value):
            continue
        text = str(value)
        raise ConfigError(
            f"{path} sets {key}={shorten(text, 80)}, which {why}; a run directory's files are data and railgate does not "
            f"take this setting from them. If you trust this run, pass it yourself: {command} ... --set "
            f"{shlex.quote(f'{key}={text}')}"
        )


def _untrusted_value(key: str, value: Any) -> bool:
    if key == "task.dataset.reward":  # the built-in rewards are railgate's own code
        return isinstance(value, str) and is_user_reward(value)
    if key == "task.env.class":  # railgate's own environments are its own code
        return not (isinstance(value, str) and value.startswith("pipeline.envs."))
    return True


def _lookup(tree: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(tree, dict):
            return None
        tree = tree.get(part)
    return tree
