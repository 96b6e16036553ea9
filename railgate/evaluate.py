"""``python run.py eval RUN_DIR``: accuracy and pass@k of a run's newest checkpoint (or of its
base policy, with ``--base``) on the task's held-out split."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import anyio

from railgate.build import build_components
from railgate.checkpoint import latest_checkpoint, load_checkpoint
from railgate.config import RunConfig
from railgate.report import markdown_table


def evaluate_run(cfg: RunConfig, base: bool = False, samples: int | None = None) -> dict[str, float]:
    if samples is not None:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval_samples=samples))
    components = build_components(cfg, progress=False)
    step = 0
    if not base:
        state = load_checkpoint(latest_checkpoint(cfg.run_dir))
        components.learner.load_state_dict(state["learner"])
        anyio.run(components.engine.update_weights, components.learner.weights())
        step = int(state["step"])
    try:
        result = anyio.run(components.evaluator.evaluate, step)
    finally:
        anyio.run(components.engine.aclose)
    result = {"step": float(step), **result}
    out = Path(cfg.run_dir) / ("eval_base.json" if base else f"eval_step{step}.json")
    out.write_text(json.dumps(result, indent=2))
    print(markdown_table(["metric", "value"], [[k, v] for k, v in result.items()]))
    print(f"written: {out}")
    return result
