"""``python run.py eval RUN_DIR``: accuracy and pass@k of a run's newest checkpoint (or of its
base policy, with ``--base``) on the task's held-out split."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import anyio

from pipeline.store.atomic import atomic_write
from railgate.build import build_components
from railgate.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from railgate.config import RunConfig
from railgate.report import markdown_table
from railgate.rundir import check_writable, refuse_links


def evaluate_run(cfg: RunConfig, base: bool = False, samples: int | None = None) -> dict[str, float]:
    if samples is not None:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval_samples=samples))
    check_writable(Path(cfg.run_dir))  # the result goes there: fail now, not after the evaluation
    refuse_links(Path(cfg.run_dir))  # nor through a link a shared run directory holds
    checkpoint = None if base else latest_checkpoint(cfg.run_dir)
    state = None if checkpoint is None else load_checkpoint(checkpoint)  # checked before anything is built
    components = build_components(cfg, progress=False)
    components.evaluator.check_rewards = True  # an evaluation whose every reward failed says so, whatever the run set
    step = 0
    if state is not None:
        try:
            components.learner.load_state_dict(state["learner"])
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
            raise CheckpointError(f"checkpoint {checkpoint} does not fit this run's model ({type(exc).__name__}: "
                                  f"{str(exc)[:160]}); evaluate with the config the run was trained with") from None
        anyio.run(components.engine.update_weights, components.learner.weights())
        step = int(state["step"])
    try:
        result = anyio.run(components.evaluator.evaluate, step)
    finally:
        anyio.run(components.engine.aclose)
    result = {"step": float(step), **result}
    out = Path(cfg.run_dir) / ("eval_base.json" if base else f"eval_step{step}.json")
    atomic_write(out, json.dumps(result, indent=2))
    print(markdown_table(["metric", "value"], [[k, v] for k, v in result.items()]))
    print(f"written: {out}")
    return result
