"""``python run.py warm-start --out DIR``: the warm-started base model as a directory of its own.

It builds the project's model for the config's task, warm-starts it exactly as a training run
does (``pipeline.policy.warmstart``: supervised steps until sampled accuracy lands nearest
``model.warm_start_target``) and writes a Hugging Face directory that ``model.path=DIR`` loads
with no second warm start -- a starting point to give railgate and another trainer alike. It
then evaluates DIR with the run's own held-out evaluation (same prompts, samples and draws as
a training run's step 0 under the same config and seed) and records the result, with its 95%
interval over prompts, in ``DIR/railgate_base.json`` under ``held_out``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from railgate.config import RunConfig


def warm_start_to(cfg: RunConfig, out: Path, progress: bool = True) -> dict[str, Any]:
    """Write the warm-started base of ``cfg`` to ``out`` and evaluate it; returns the
    ``held_out`` record (accuracy, its interval, prompts, samples per prompt, seed)."""
    from pipeline.config.build import ConfigError
    from pipeline.policy.models import META_FILE, build_base_model
    from railgate.evaluate import Policy, evaluate_policy
    from railgate.preflight import preflight

    if cfg.model.path:
        raise ConfigError(
            f"warm-start builds the project's model, and model.path={cfg.model.path!r} names a model of "
            "your own (used as it is, no warm start); drop --set model.path"
        )
    if cfg.engine.kind == "sim":
        raise ConfigError(
            "warm-start needs a real model; the config sets engine.kind=sim: use configs/default.yaml "
            "or set engine.kind=torch"
        )
    preflight(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path="")))
    base = build_base_model(cfg.task, cfg.model, out, progress)
    evaluation = evaluate_policy(cfg, Policy(out))
    m = evaluation.metrics
    held_out = {
        "accuracy": m["eval/accuracy"],
        "accuracy_lo": m["eval/accuracy_lo"],
        "accuracy_hi": m["eval/accuracy_hi"],
        "prompts": sum(r == r for r in evaluation.rates),
        "samples": cfg.data.eval_samples,
        "seed": cfg.seed,
    }
    meta = {**base.meta, "held_out": held_out}
    (out / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return held_out
