"""The run configuration: one frozen dataclass composing each package's own settings.

YAML files in configs/ mirror it; ``load_config(path, overrides)`` reads one, applies
``--set key=value`` overrides and validates everything (unknown keys are errors that name
the key and the closest valid one).

>>> cfg = load_config(None, ["orchestrator.steps=3", "gate.kind=uniform"])
>>> cfg.orchestrator.steps, cfg.gate.kind
(3, 'uniform')

Rules across sections are checked at load time too, before any model is built:

>>> load_config(None, ["gate.kind=sara", "gate.sara.probe_size=12", "orchestrator.group_size=8"])
Traceback (most recent call last):
...
pipeline.config.build.ConfigError: gate.sara.probe_size=12 is above orchestrator.group_size=8; lower gate.sara.probe_size or raise orchestrator.group_size
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.config import ControllerConfig, GateConfig
from learner.config import LearnerConfig
from pipeline.config.build import ConfigError, apply_overrides, build, load_yaml, merge, require, shorten, to_dict
from pipeline.config.sections import (
    DataConfig,
    EngineConfig,
    LogConfig,
    OrchestratorConfig,
    ReplayConfig,
    SimConfig,
    TorchEngineConfig,
)
from pipeline.policy.config import BaseModelConfig
from pipeline.tasks.config import TaskConfig

ROLLOUT_STEP_GATES = ("uniform", "sara", "dps", "sara_dps")
"""The gates that commit group by group with no per-step quota of their own, so a learner
step may be defined by rollouts (``orchestrator.batch_rollouts``). DS, Pilot-Commit and HORA
fill exactly ``batch_groups`` groups per step; the oracle books rollouts as uncounted."""

MODEL_FREE_ENGINES = ("sim", "replay")
"""Engines that run no model: the task, model and generation-length settings are unused."""


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs."""

    seed: int = 0
    """Run seed; every component's seed is derived from it (pipeline/seeding.py)."""
    run_dir: str = "runs/default"
    """Where checkpoints, logs, traces and reports go."""
    run_id: str = ""
    """Name of the run in traces (default: the run directory's name)."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    orchestrator: OrchestratorConfig = field(default_factory=OrchestratorConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: BaseModelConfig = field(default_factory=BaseModelConfig)
    torch_engine: TorchEngineConfig = field(default_factory=TorchEngineConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        """Rules that tie two sections together; each section checks its own values when built.
        They run when a config is loaded, before anything is written, loaded or warm-started."""
        require(bool(self.run_dir), "run_dir must not be empty; set run_dir: runs/NAME")
        o = self.orchestrator
        self.gate.check_sizes(o.group_size, o.batch_groups)
        require(
            not o.batch_rollouts or self.gate.kind in ROLLOUT_STEP_GATES,
            f"orchestrator.batch_rollouts={o.batch_rollouts} (a learner step of that many rollouts) needs a gate that "
            f"commits group by group ({', '.join(ROLLOUT_STEP_GATES)}), not gate.kind={self.gate.kind!r}; "
            "change gate.kind or set orchestrator.batch_rollouts=0",
        )
        self.gate.check_sampling(o.temperature, o.top_p)
        require(
            self.gate.mode == "live" or self.controller.kind == "none",
            f"gate.mode=shadow trains as plain GRPO, and controller.kind={self.controller.kind} would intervene "
            "(branches, resamples) in it; set controller.kind=none or gate.mode=live",
        )
        if self.engine.kind == "replay":
            require(
                bool(self.replay.log),
                "engine.kind=replay needs a group log to replay: --set replay.log=PATH (a directory written by "
                "`python run.py record`, or a .parquet file of the group-log columns)",
            )
        if self.engine.kind not in MODEL_FREE_ENGINES and not self.model.path:
            require(
                o.max_tokens < self.model.max_len,
                f"orchestrator.max_tokens={o.max_tokens} leaves no room for a prompt in model.max_len={self.model.max_len}; "
                "lower orchestrator.max_tokens or raise model.max_len (a new base model)",
            )
            arith = self.task.arithmetic
            if self.task.name == "arithmetic" and arith.scratchpad:
                need = arith.response_tokens
                fit_tokens, fit_len = self.task.lengths(self.model.max_len) or (need, self.model.max_len)
                require(
                    o.max_tokens >= need,
                    f"task.arithmetic.scratchpad=true writes responses of up to {need} tokens, but orchestrator.max_tokens="
                    f"{o.max_tokens}; set orchestrator.max_tokens={fit_tokens} and model.max_len={fit_len} or more, "
                    "or leave both out of the config: they then follow from the task",
                )
            require(
                not self.task.chat_template,
                "task.chat_template=true needs a chat model, and the project's model (model.path empty) has no chat "
                "template; set model.path to a Hugging Face chat model directory, or task.chat_template=false",
            )

    @property
    def name(self) -> str:
        return self.run_id or Path(self.run_dir).name


def load_config(
    path: str | Path | None, overrides: list[str] | None = None, base: dict[str, Any] | None = None
) -> RunConfig:
    """Read ``path`` (or the defaults), apply ``overrides``, validate."""
    data = merge(base or {}, load_yaml(path) if path else {})
    data = apply_overrides(data, overrides or [])
    return build(RunConfig, fill_step(fill_lengths(data)))


PROJECT_MODEL_MAX_TOKENS = 16
"""Generation length on the project's own model for a task that states no token need (a dataset)."""


def fill_lengths(data: dict[str, Any]) -> dict[str, Any]:
    """``orchestrator.max_tokens`` and ``model.max_len`` from the task's token needs
    (``TaskConfig.lengths``), each where the config does not give it, on a real engine (a
    ``model.path`` keeps its own context length; ``model.max_len`` is then only recorded).
    A value the config gives is kept and checked.

    >>> cfg = load_config(None, ["engine.kind=torch", "task.arithmetic.scratchpad=true"])
    >>> cfg.orchestrator.max_tokens, cfg.model.max_len
    (64, 96)
    >>> load_config(None, ["engine.kind=torch", "orchestrator.max_tokens=24"]).orchestrator.max_tokens
    24
    """
    try:  # a bad section is reported by the full build, with its own message
        task = build(TaskConfig, data.get("task"), "task")
        engine = build(EngineConfig, data.get("engine"), "engine")
        orchestrator = data.get("orchestrator") or {}
        model_data = data.get("model") or {}
        if not isinstance(orchestrator, dict) or not isinstance(model_data, dict):
            return data
    except ConfigError:
        return data
    default_len = BaseModelConfig.__dataclass_fields__["max_len"].default
    fit = task.lengths(default_len)
    if engine.kind in MODEL_FREE_ENGINES or (fit is None and model_data.get("path")):
        return data  # a user's model with a task of no stated need: the settings' own defaults
    if fit is None:  # the project's model: the short answers it is built for
        fit = (PROJECT_MODEL_MAX_TOKENS, default_len)
    out = dict(data)
    if "max_tokens" not in orchestrator:
        out["orchestrator"] = {**orchestrator, "max_tokens": fit[0]}
    if "max_len" not in model_data:
        out["model"] = {**model_data, "max_len": fit[1]}
    return out


STEP_AUTO = "auto"
"""``orchestrator.batch_rollouts: auto``: a learner step of ``batch_groups * group_size`` rollouts
generated where the gate commits group by group (``ROLLOUT_STEP_GATES``), ``batch_groups``
committed groups with the others."""


def fill_step(data: dict[str, Any]) -> dict[str, Any]:
    """Resolve ``orchestrator.batch_rollouts: auto`` into the number it stands for, so the built
    (and saved) config holds a plain integer that follows the run's batch size and gate:
    ``batch_groups * group_size`` with a gate that commits group by group, 0 (a step of
    ``batch_groups`` committed groups) with DS, Pilot-Commit, HORA and the oracle, which fill
    their own per-step quota.

    >>> auto = ["orchestrator.batch_rollouts=auto", "orchestrator.batch_groups=4"]
    >>> load_config(None, auto + ["gate.kind=sara"]).orchestrator.batch_rollouts
    32
    >>> load_config(None, auto + ["gate.kind=hora"]).orchestrator.batch_rollouts
    0
    """
    orchestrator = data.get("orchestrator")
    if not isinstance(orchestrator, dict):
        return data
    value = orchestrator.get("batch_rollouts")
    if not isinstance(value, str) or value.strip().lstrip("+-").isdigit():
        return data
    if value.strip().lower() != STEP_AUTO:
        raise ConfigError(
            f"orchestrator.batch_rollouts={shorten(value)} must be an integer (0 = a step of batch_groups "
            f"groups) or {STEP_AUTO!r} (batch_groups * group_size rollouts)"
        )
    gate = data.get("gate") if isinstance(data.get("gate"), dict) else {}
    kind = gate.get("kind", GateConfig.__dataclass_fields__["kind"].default)
    fields = OrchestratorConfig.__dataclass_fields__
    try:
        groups = int(orchestrator.get("batch_groups", fields["batch_groups"].default))
        size = int(orchestrator.get("group_size", fields["group_size"].default))
    except (TypeError, ValueError):
        return {**data, "orchestrator": {**orchestrator, "batch_rollouts": 0}}  # the build names the bad value
    resolved = groups * size if kind in ROLLOUT_STEP_GATES else 0
    return {**data, "orchestrator": {**orchestrator, "batch_rollouts": resolved}}


def dump_config(config: RunConfig) -> dict[str, Any]:
    return to_dict(config)


__all__ = ["RunConfig", "load_config", "fill_lengths", "fill_step", "dump_config", "ConfigError"]
