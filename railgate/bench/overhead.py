"""``python run.py bench overhead``: what the pipeline costs on top of its engine.

1. **Throughput**: the full pipeline (uniform gate, no-op controller, rewards, tracker, Arrow
   buffer, trace log, sim learner with a zero learning rate so every pass does identical work)
   against the raw engine streaming exactly the same requests with the same concurrency limit,
   each request the pipeline stopped early aborted after the same tokens, interleaved in one
   process, best of ``repeats``. Two engine-time models:
   *virtual* (the sim flat out: pure Python cost per rollout, the worst case for the ratio) and
   *real time* (the sim sleeps through decode time like a real engine; the ratio that matters
   when the engine is the bottleneck, as a GPU engine is), the latter also with one more step of
   look-ahead, to separate the step-ahead bound from the pipeline's own cost.
2. **Decision-hook latency**: p50/p99 of snapshot + ``gate.update`` + ``controller.on_group`` at
   64, 512 and 4096 concurrent groups, with the per-rollout cost at each level and the raw
   engine's on the same level's requests.

Both drivers of the engine are measured in the same run: every sample from one consumer of the
engine's multiplexer (the default, ``orchestrator.multiplex_streams``) and a task per sample.
3. **Long run**: a small-batch sim run of many steps; resident memory after the warm-up and at
   the end, and the trace log re-read every so often while it is written.

The raw engine's side (recording the pipeline's requests, streaming them again) is
``railgate.bench.raw``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import psutil

from controller.rail.config import RailConfig
from controller.rail.controller import RailController
from pipeline.core.hooktimer import HookTimer
from pipeline.shells.parts import RunOutputs
from pipeline.store.tracelog import read_trace
from railgate.bench.raw import Recorder, raw_pass
from railgate.build import build_components, build_orchestrator
from railgate.config import RunConfig
from railgate.report import markdown_table
from railgate.train import train


def _pipeline_pass(cfg: RunConfig, work_dir: Path, record: bool = False) -> tuple[float, int, Recorder | None]:
    from pipeline.store.buffer import ArrowBuffer
    from pipeline.store.tracelog import TraceLog

    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    comps = build_components(cfg)
    engine = Recorder(comps.engine) if record else comps.engine
    trace = TraceLog(work_dir / "trace", "bench")
    buffer = ArrowBuffer(work_dir / "buffer", run_id="bench")
    orch = build_orchestrator(
        cfg, dataclasses.replace(comps, engine=engine, evaluator=None), RunOutputs(buffer=buffer, trace=trace)
    )
    started = time.perf_counter()
    summary = anyio.run(orch.run)
    elapsed = time.perf_counter() - started
    trace.close()
    buffer.close()
    return elapsed, summary.budget.rollouts_started, engine if record else None


# Throughput passes: (label, real-time engine model, max_async_steps override or None = the config's,
# multiplexed driver). The third pass lifts the step-ahead limit by one step: with one, open groups
# whose last samples are still running (and committed groups waiting for a batch) hold the
# admission room, so fewer samples stream than the concurrency limit allows; the pass shows what
# that bound costs, separately from the pipeline's own work. The last pass drives the engine with
# a task per sample, pipeline and raw alike (the path before the multiplexer).
THROUGHPUT_PASSES: tuple[tuple[str, bool, int | None, bool], ...] = (
    ("virtual (CPU-bound)", False, None, True),
    ("real-time engine model", True, None, True),
    ("real-time engine model", True, 2, True),
    ("virtual (CPU-bound)", False, None, False),
)
DRIVERS = {True: "multiplexed", False: "task per sample"}


def throughput(
    cfg: RunConfig,
    out: Path,
    repeats: int = 3,
    passes: tuple[tuple[str, bool, int | None, bool], ...] = THROUGHPUT_PASSES,
) -> list[dict[str, Any]]:
    """The full pipeline against the raw engine on the same requests, best of ``repeats`` each."""
    rows = []
    for label, realtime, async_steps, multiplex in passes:
        sim = dataclasses.replace(cfg.sim, realtime=realtime, learning_rate=0.0, prompt_learning_rate=0.0)
        orch = dataclasses.replace(cfg.orchestrator, multiplex_streams=multiplex)
        if async_steps is not None:
            orch = dataclasses.replace(orch, max_async_steps=async_steps)
        c = dataclasses.replace(cfg, sim=sim, orchestrator=orch)
        _, n, recorder = _pipeline_pass(c, out / "work", record=True)
        assert recorder is not None
        pipe_times, raw_times = [], []
        for _ in range(repeats):
            pipe_times.append(_pipeline_pass(c, out / "work")[0])
            raw_times.append(raw_pass(c, recorder.requests[:n], recorder.cut_after()[:n]))
        pipe, raw = min(pipe_times), min(raw_times)
        rows.append(
            {
                "engine time": label,
                "driver": DRIVERS[multiplex],
                "max_async_steps": orch.max_async_steps,
                "rollouts": n,
                "pipeline samples in flight": recorder.mean_in_flight(),
                "concurrency limit": orch.max_concurrent_samples,
                "raw rollouts/s": n / raw,
                "pipeline rollouts/s": n / pipe,
                "ratio": raw / pipe,
                "overhead us/rollout": (pipe - raw) / n * 1e6,
            }
        )
        print(rows[-1], flush=True)
    return rows


# (gate, controller, multiplexed driver) measured at each level: the gate alone, then SARA with RAIL
# live, each also with a task per sample (the driver before the multiplexer), in the same run.
# "rail": decision points batched (token and group-level) and scored by the numpy snapshot of VW's
# model (the defaults); "rail_vw": each decided at once by one VW parse and predict
# (``vw_snapshot_every=0``, ``batch_token_decisions=false``, ``batch_group_decisions=false``: the
# path before any of them existed).
HOOK_VARIANTS: tuple[tuple[str, str, bool], ...] = (
    ("uniform", "none", True),
    ("uniform", "none", False),
    ("sara", "none", True),
    ("sara", "rail", True),
    ("sara", "rail", False),
)
CONTROLLER_LABELS = {
    "none": "none",
    "rail": "RAIL (vw snapshot, batched, live)",
    "rail_vw": "RAIL (vw per decision, live)",
}


def _hook_config(cfg: RunConfig, groups: int, gate: str, controller: str, multiplex: bool = True) -> RunConfig:
    orch_cfg = dataclasses.replace(
        cfg.orchestrator,
        batch_groups=groups,
        max_open_groups=groups,
        max_concurrent_samples=groups * cfg.orchestrator.group_size,
        max_async_steps=0,
        steps=max(2, 2048 // groups),
        eval_every=0,
        multiplex_streams=multiplex,
    )
    sim = dataclasses.replace(cfg.sim, num_prompts=max(cfg.sim.num_prompts, 2 * groups))
    gate_cfg = dataclasses.replace(cfg.gate, kind=gate)
    ctrl = cfg.controller
    if controller in ("rail", "rail_vw"):
        # RAIL acting (live) from the first decision, with its default VW backend.
        new_path = controller == "rail"  # the defaults' snapshot and batching, or neither
        rail = dataclasses.replace(
            ctrl.rail,
            mode="live",
            auto_promote=False,
            backend="vw",
            batch_token_decisions=new_path,
            batch_group_decisions=new_path,
            vw_snapshot_every=RailConfig().vw_snapshot_every if new_path else 0,
        )
        ctrl = dataclasses.replace(ctrl, kind="rail", rail=rail)
    else:
        ctrl = dataclasses.replace(ctrl, kind="none")
    return dataclasses.replace(cfg, orchestrator=orch_cfg, sim=sim, gate=gate_cfg, controller=ctrl)


def _percentile_us(samples: list[int], q: float) -> float:
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] / 1000.0


def hook_latency(
    cfg: RunConfig,
    levels: tuple[int, ...] = (64, 512, 4096),
    variants: tuple[tuple[str, str, bool], ...] = HOOK_VARIANTS,
) -> list[dict[str, Any]]:
    """Per level and (gate, controller, driver): the decision hook's p50/p99 (snapshot + gate +
    controller per finished sample), RAIL's own decisions (group and token decision points;
    amortised per decision when decided in batches; p50 and p99 over every decision of the run,
    and p99 over the last 20,000, the window of the controller's own metrics) and the whole
    pipeline's cost per rollout.

    At each level the first variant's requests are streamed again through the raw engine (no
    pipeline, the same concurrency limit), once per driver: from one consumer of the engine's
    multiplexer, and with one task per request. Its CPU per rollout is what the engine and the
    driver cost by themselves, and each row's *over raw* column is the pipeline's CPU per
    rollout less the raw engine's with the same driver."""
    rows = []
    for groups in levels:
        raw_cpu_us: dict[bool, float] = {}
        for k, (gate, controller, multiplex) in enumerate(variants):
            c = _hook_config(cfg, groups, gate, controller, multiplex)
            comps = build_components(c)
            if hasattr(comps.controller, "latency_ns"):
                # Every decision of the run: the controller keeps only the last LATENCY_WINDOW
                # (20,000) for its metrics, at 4096 groups the last quarter (the second step's drain).
                comps.controller.latency_ns = collections.deque()
            recorder = Recorder(comps.engine, timed=False) if k == 0 else None
            timer = HookTimer()
            engine = recorder if recorder is not None else comps.engine
            orch = build_orchestrator(
                c, dataclasses.replace(comps, engine=engine, evaluator=None), RunOutputs(hook_timer=timer)
            )
            started, cpu = time.perf_counter(), time.process_time()
            summary = anyio.run(orch.run)
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
            n = max(1, summary.budget.rollouts_started)
            if recorder is not None:
                for raw_multiplex in DRIVERS:
                    raw_cfg = dataclasses.replace(
                        c, orchestrator=dataclasses.replace(c.orchestrator, multiplex_streams=raw_multiplex)
                    )
                    raw_started = time.process_time()
                    raw_pass(raw_cfg, recorder.requests[:n])
                    raw_cpu_us[raw_multiplex] = (time.process_time() - raw_started) / n * 1e6
            decisions = list(getattr(comps.controller, "latency_ns", ()))
            cpu_us = cpu / n * 1e6
            raw_us = raw_cpu_us.get(multiplex, math.nan)
            rows.append(
                {
                    "concurrent groups": groups,
                    "gate": gate,
                    "controller": CONTROLLER_LABELS[controller],
                    "driver": DRIVERS[multiplex],
                    "hook calls": timer.calls,
                    "hook p50 us": timer.percentile_us(50),
                    "hook p99 us": timer.percentile_us(99),
                    "RAIL decisions": int(summary.controller_metrics.get("controller/decisions", len(decisions)))
                    if controller != "none"
                    else 0,
                    "decisions timed": len(decisions),
                    "decision p50 us": _percentile_us(decisions, 50),
                    "decision p99 us": _percentile_us(decisions, 99),
                    "decision p99 us, last 20,000": _percentile_us(decisions[-RailController.LATENCY_WINDOW :], 99),
                    "rollouts": summary.budget.rollouts_started,
                    "pipeline us/rollout": elapsed / n * 1e6,
                    # CPU time of this process: what the pipeline costs, less exposed to other load.
                    "pipeline CPU us/rollout": cpu_us,
                    "raw engine CPU us/rollout": raw_us,
                    "over raw CPU us/rollout": cpu_us - raw_us,
                }
            )
            print(rows[-1], flush=True)
    return rows


def _read_trace_elsewhere(trace_dir: Path) -> int:
    """The decisions in the trace being written, read by another process, as a user's monitor
    would: the reader's memory (Arrow's allocator keeps what it read) is then not counted in the
    run's RSS."""
    code = (
        "import sys; from pipeline.store.tracelog import read_trace; print(read_trace(sys.argv[1]).decisions.num_rows)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(trace_dir)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"re-reading the trace {trace_dir} while it is written failed:\n{done.stderr.strip()}")
    return int(done.stdout.split()[-1])


def long_run(cfg: RunConfig, out: Path, steps: int) -> dict[str, Any]:
    run_dir = out / "long_run"
    shutil.rmtree(run_dir, ignore_errors=True)
    orch_cfg = dataclasses.replace(
        cfg.orchestrator,
        steps=steps,
        batch_groups=4,
        group_size=4,
        max_concurrent_samples=64,
        max_open_groups=16,
        eval_every=max(1, steps // 20),
    )
    c = dataclasses.replace(
        cfg,
        orchestrator=orch_cfg,
        run_dir=str(run_dir),
        log=dataclasses.replace(cfg.log, tensorboard=False, progress=False),
    )
    process = psutil.Process()
    marks: dict[str, Any] = {"trace_reads": []}
    warm = max(1, steps // 10)
    every = max(1, steps // 10)

    def on_step(step: int, metrics: dict[str, float]) -> None:
        if step % every == 0:
            marks["trace_reads"].append((step, _read_trace_elsewhere(run_dir / "trace")))
        # The last mark is taken before the run's report and plot load their libraries.
        if step == warm:
            marks["rss_warm_mb"] = process.memory_info().rss / 2**20
            marks["step_warm"] = step
        if step == steps:
            marks["rss_end_mb"] = process.memory_info().rss / 2**20

    started = time.perf_counter()
    result = train(c, progress=False, on_step=on_step)
    final = read_trace(run_dir / "trace")
    return {
        "steps": result.summary.steps,
        "rollouts": result.summary.budget.rollouts_started,
        "wall_s": time.perf_counter() - started,
        "rss_start_mb": marks.get("rss_warm_mb"),
        "rss_start_step": marks.get("step_warm"),
        "rss_end_mb": marks.get("rss_end_mb", process.memory_info().rss / 2**20),
        "trace_reads": marks["trace_reads"],
        "trace_decisions_final": final.decisions.num_rows,
        "trace_torn_files": len(final.torn),
    }


def run_overhead_bench(
    cfg: RunConfig, out: Path, long_steps: int | None = None, progress: bool = True
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"load_average_start": list(os.getloadavg()), "cpus": os.cpu_count()}
    sections = []
    report["throughput"] = throughput(cfg, out)
    sections.append("## Pipeline vs raw engine (same requests, same run)\n\n" + _table(report["throughput"]))
    print(sections[-1], flush=True)
    report["hooks"] = hook_latency(cfg)
    sections.append("## Decision-hook latency\n\n" + _table(report["hooks"]))
    print(sections[-1], flush=True)
    steps = long_steps if long_steps is not None else 20_000
    if steps > 0:
        report["long_run"] = long_run(cfg, out, steps)
        lr = report["long_run"]
        sections.append(
            "## Long run\n\n"
            + markdown_table(
                [
                    "steps",
                    "rollouts",
                    "wall s",
                    f"RSS MB at step {lr['rss_start_step']}",
                    "RSS MB at end",
                    "trace re-reads",
                    "decisions in trace",
                    "torn trace files",
                ],
                [
                    [
                        lr["steps"],
                        lr["rollouts"],
                        lr["wall_s"],
                        lr["rss_start_mb"],
                        lr["rss_end_mb"],
                        len(lr["trace_reads"]),
                        lr["trace_decisions_final"],
                        lr["trace_torn_files"],
                    ]
                ],
            )
        )
        print(sections[-1], flush=True)
    report["load_average_end"] = list(os.getloadavg())
    sections.insert(
        0,
        "Load average (1, 5, 15 min) at the start: {} and at the end: {} ({} CPUs)".format(
            ", ".join(f"{x:.2f}" for x in report["load_average_start"]),
            ", ".join(f"{x:.2f}" for x in report["load_average_end"]),
            report["cpus"],
        ),
    )
    (out / "overhead.md").write_text("\n\n".join(sections) + "\n")
    (out / "overhead.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"\nwritten: {out / 'overhead.md'}")
    return report


def _table(rows: list[dict[str, Any]]) -> str:
    headers = list(rows[0].keys())
    return markdown_table(headers, [[r[h] for h in headers] for r in rows])
