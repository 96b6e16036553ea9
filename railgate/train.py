"""The ``train`` job: build the components, run the orchestrator, write the run directory.

Run directory layout (formats users rely on; see the README):

    config.yaml        the resolved configuration
    metrics.jsonl      one line per learner step, namespaced metric names; step 0: the evaluation before training
    trace/             decisions-NNNNN.arrows, outcomes-NNNNN.arrows (pipeline.store.tracelog)
    buffer/            steps-NNNNN.arrows, one record batch per learner step (pipeline.store.buffer)
    groups/            gate.mode=shadow: every step's full groups (a group log) and shadow.json (railgate.shadow_run)
    summary.json       final budget, evaluations, stop reason
    report.md          the summary table
    accuracy.png       held-out accuracy against cumulative rollouts (overall and per level)
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from pipeline.core.decisions import NullSink
from pipeline.metrics import MetricsWriter
from pipeline.shells.orchestrator import RunSummary
from pipeline.shells.parts import RunOutputs, RunParts
from pipeline.store.atomic import atomic_write
from pipeline.store.buffer import ArrowBuffer
from pipeline.store.tracelog import TraceLog
from railgate.build import build_components, build_orchestrator
from railgate.checkpoint import CheckpointWriter
from railgate.config import RunConfig
from railgate.diskerrors import close_all
from railgate.interrupt import run_orchestrator
from railgate.preflight import preflight
from railgate.progress import ProgressBar
from railgate.report import accuracy_plot, summary_table
from railgate.rundir import RunDir, TraceSlot, open_run_dir
from railgate.shadow_run import ShadowMetrics, ShadowRecorder, training_config


@dataclass
class TrainResult:
    run_dir: Path
    summary: RunSummary
    components: RunParts
    run_id: str = ""
    """The run's id (``railgate.runid``): its trace and buffer segments carry it."""


def tune_gc() -> None:
    """The pipeline allocates many short-lived objects; freezing start-up objects and raising
    the young-generation threshold cuts the collector's share of a run by about a quarter."""
    gc.freeze()
    gc.set_threshold(50_000, 50, 1000)


def train(
    cfg: RunConfig,
    progress: bool | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    command: str = "train",
) -> TrainResult:
    """Run one training job; ``on_step(step, metrics)`` is called after every learner step.

    With ``resume`` the newest checkpoint of ``cfg.run_dir`` is loaded: gate, controller and
    learner state, the data cursor, the budget and the committed groups not yet trained carry
    over; trace and buffer records the killed run wrote after that checkpoint are superseded
    (``pipeline.store.arrowio.mark_superseded``), so nothing is lost or counted twice. Without it a
    directory that already holds a run is refused unless ``overwrite`` (``railgate.rundir``).
    """
    preflight(cfg)  # engines, model and dataset paths: before anything is written or warm-started
    with open_run_dir(
        cfg, resume=resume, overwrite=overwrite, command=command
    ) as run:  # one writer; resume checked first
        return _train(cfg, run, progress, on_step)


def _train(cfg: RunConfig, run: RunDir, progress: bool | None, on_step: Callable | None) -> TrainResult:
    run_dir, state = run.path, run.state
    show = cfg.log.progress if progress is None else progress
    sink = TraceSlot() if cfg.log.trace else NullSink()  # the trace opens once the resume has succeeded
    shadow = cfg.gate.mode == "shadow"
    built = training_config(cfg) if shadow else cfg  # shadow: trained as uniform GRPO (railgate.shadow_run)
    components = build_components(built, progress=show, sink=sink, run_id=run.run_id)
    start = int(state["step"]) if state else 0
    bar = ProgressBar(total=cfg.orchestrator.steps, enabled=show, desc=f"train {cfg.name}", initial=start)
    writer = (
        CheckpointWriter(run_dir, keep=cfg.log.keep_checkpoints, run_id=run.run_id)
        if cfg.log.checkpoint_every
        else None
    )
    outputs = RunOutputs(
        trace=sink, on_step=_chain(bar.update, on_step), checkpoint=_chain_checkpoint(writer, run.record_config)
    )
    orchestrator = build_orchestrator(built, components, outputs, run_id=run.run_id)
    run.commit(orchestrator)  # resume: restore the checkpoint; then the run id, config.yaml and the supersede rules
    trace = (
        sink.attach(TraceLog(run_dir / "trace", run.run_id, flush_every=cfg.log.trace_flush_every))
        if cfg.log.trace
        else sink
    )
    if isinstance(trace, TraceLog):
        trace.clock = components.clock.now  # outcomes on the decisions' time base
    outputs.trace = trace
    buffer = outputs.buffer = (
        ArrowBuffer(run_dir / "buffer", persist=True, run_id=run.run_id) if cfg.log.buffer else None
    )
    metrics = outputs.metrics = MetricsWriter(run_dir, tensorboard=cfg.log.tensorboard)
    if shadow:
        recorder = ShadowRecorder(run_dir, cfg, components.gate.pool.get, inner=buffer, run_id=run.run_id)
        buffer = outputs.buffer = recorder
        metrics = outputs.metrics = ShadowMetrics(metrics, recorder)
    orchestrator.parts.scoring.health.listeners.append(
        bar.reward_failed
    )  # failures on the progress line as they happen
    try:
        summary = run_orchestrator(orchestrator)  # Ctrl-C: stop at a step boundary with a checkpoint
    finally:
        bar.close()
        try:
            close_all(trace, buffer, metrics)  # each one, even when another fails (a full disk)
        finally:
            anyio.run(components.engine.aclose)
    run.record_config()  # a resumed run's settings, once they ran
    write_summary(run_dir, cfg, summary, run_id=run.run_id)
    return TrainResult(run_dir, summary, components, run.run_id)


def _chain_checkpoint(writer: CheckpointWriter | None, after: Callable[[], None]) -> Callable | None:
    """The checkpoint callback: write the checkpoint, then ``after`` (a resumed run's config.yaml)."""
    if writer is None:
        return None

    def checkpoint(state: dict[str, Any]) -> None:
        writer(state)
        after()

    return checkpoint


def _chain(*callbacks):
    live = [c for c in callbacks if c is not None]

    def call(step: int, metrics: dict[str, float]) -> None:
        for c in live:
            c(step, metrics)

    return call


def write_summary(run_dir: Path, cfg: RunConfig, summary: RunSummary, run_id: str | None = None) -> None:
    """``summary.json``, ``report.md`` and ``accuracy.png``, each written whole or not at all."""
    record: dict[str, Any] = {
        "run_id": run_id or cfg.name,
        "steps": summary.steps,
        "stop_reason": summary.stop_reason,
        "wall_s": summary.wall_s,
        "budget": summary.budget.as_metrics(),
        "evals": summary.evals,
        "controller": summary.controller_metrics,
    }
    atomic_write(run_dir / "summary.json", json.dumps(_finite(record), indent=2))
    report = summary_table(cfg, summary) + "\n"
    if accuracy_plot(summary.evals, run_dir / "accuracy.png", title=f"{cfg.name}: {cfg.gate.kind}"):
        report += "\n![held-out accuracy against cumulative rollouts](accuracy.png)\n"
    atomic_write(run_dir / "report.md", report)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
