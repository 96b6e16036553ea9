"""The figures of ``bench trl``: per seed, per trainer, and gated against plain GRPO.

Targets are the start accuracy (the first evaluation, the same model and the same seeded draws
for both trainers of a seed) plus 0.1 and 0.2, reached after so many generated rollouts and so
many training CPU-seconds (what a user pays: fewer rollouts at a higher cost each can still be
less time). Ratios are taken per seed (gated / GRPO) and
then averaged; a target a run never reached is counted and left out of the means. Accuracy is
also compared paired by seed, gated - GRPO at equal rollouts and at equal optimiser steps (the
earlier of the two runs' ends on each axis), with the mean and its 95% t interval over seeds.

>>> from railgate.bench.trl import RunRecord
>>> def run(trainer, accs, cpu):
...     points = [Point(i * 100, 0, 0.0, a, 0.02, i) for i, a in enumerate(accs)]
...     return RunRecord(trainer, 0, points, 100 * (len(accs) - 1), 0, cpu, 0.0, 0.0, 1)
>>> s = summary([run("grpo", [0.3, 0.35, 0.4, 0.5], 3.0), run("gated", [0.3, 0.4, 0.5, 0.55], 3.0)])
>>> s["gated"]["to_target"]["0.1"], s["ratio"]["to_target"]["0.1"], s["ratio"]["cpu_per_rollout"]
([100.0], [0.5], [1.0])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TARGETS = (0.1, 0.2)


@dataclass(frozen=True)
class Point:
    """One held-out evaluation: where the run was (rollouts generated, tokens, training
    CPU-seconds, optimiser step) and the accuracy with the half-width of its 95% interval."""

    rollouts: int
    tokens: int
    cpu_s: float
    accuracy: float
    ci95: float
    step: int


@dataclass(frozen=True)
class StepLog:
    """One optimiser step of a run, as logged at its end (``railgate.bench.trl_steps``)."""

    step: int
    rollouts: int
    """Rollouts generated so far (this step's included)."""
    tokens: int
    grad_norm: float | None
    """The gradient norm before clipping (TRL's ``grad_norm``)."""
    frac_reward_zero_std: float | None
    """TRL's share of the step's rows whose group has all-equal rewards (a gated step's pad
    groups, which have no rewards, count as not zero-std there)."""
    mixed_groups: int | None
    """Groups trained this step whose rewards differ: the gate's own count for the gated trainer,
    ``prompts x (1 - frac_reward_zero_std)`` for GRPO; None where neither is known."""
    loss: float | None = None
    reward: float | None = None
    """TRL's mean reward of the trained rows."""
    trace_sigma: float | None = None
    grad_dot_prev: float | None = None
    """The step's estimates of tr(Σ) and |G|² (``railgate.trl.noise``; None on the first step)."""
    rows_trained: float | None = None
    """Rows the step trained (pad rows included), the batch the noise scale is compared with."""


NAMES = {"grpo": "GRPOTrainer", "gated": "GatedGRPOTrainer", "cgrpo": "CGRPOTrainer (trl-cgrpo)"}


def summary(runs: Sequence[Any]) -> dict[str, Any]:
    """Per trainer: per-seed rollouts and CPU-seconds to each target, final accuracy and interval,
    CPU per rollout; per seed with both trainers: the ratios gated / GRPO (and C-GRPO / GRPO on
    the seeds where the peer ran)."""
    by = {(r.trainer, r.seed): r for r in runs}
    seeds = sorted({s for t, s in by if ("grpo", s) in by and ("gated", s) in by})
    out: dict[str, Any] = {"seeds": seeds}
    for trainer in ("grpo", "gated"):
        out[trainer] = _stats([by[(trainer, s)] for s in seeds], [by[("grpo", s)] for s in seeds])
    out["ratio"] = _ratios(out["gated"], out["grpo"])
    out["ratio"].update(_paired([by[("gated", s)] for s in seeds], [by[("grpo", s)] for s in seeds]))
    peer = [s for s in seeds if ("cgrpo", s) in by]
    if peer:
        grpo = _stats([by[("grpo", s)] for s in peer], [by[("grpo", s)] for s in peer])
        out["cgrpo_seeds"] = peer
        out["cgrpo"] = _stats([by[("cgrpo", s)] for s in peer], [by[("grpo", s)] for s in peer])
        out["ratio_cgrpo"] = _ratios(out["cgrpo"], grpo)
        out["ratio_cgrpo"].update(_paired([by[("cgrpo", s)] for s in peer], [by[("grpo", s)] for s in peer]))
    return out


def _stats(rs: Sequence[Any], grpo: Sequence[Any]) -> dict[str, Any]:
    """One trainer's runs; targets from the start of GRPO's run of the same seed."""
    starts = [g.points[0].accuracy for g in grpo]
    regimes = [run_regime(r) for r in rs]
    return {
        "start": [r.points[0].accuracy for r in rs],
        "to_target": {str(t): [r.rollouts_to(a + t) for r, a in zip(rs, starts)] for t in TARGETS},
        "cpu_to_target": {str(t): [r.cpu_to(a + t) for r, a in zip(rs, starts)] for t in TARGETS},
        "final": [r.points[-1].accuracy for r in rs],
        "final_ci95": [r.points[-1].ci95 for r in rs],
        "cpu_per_rollout": [r.cpu_per_rollout for r in rs],
        "rollouts": [r.rollouts for r in rs],
        "steps": [r.steps for r in rs],
        "noise_scale_rows": [g["noise_scale"] for g in regimes],
        "regime": [g["regime"] for g in regimes],
    }


def _at_equal_rollouts(a: Any, b: Any) -> tuple[float, float]:
    """a's and b's accuracies where both have generated the same rollouts: the fewer of their ends."""
    end = min(a.points[-1].rollouts, b.points[-1].rollouts)
    return a.accuracy_at(end), b.accuracy_at(end)


def _at_equal_steps(a: Any, b: Any) -> tuple[float, float]:
    """a's and b's accuracies after the same optimiser steps: the fewer of their last evaluations'."""
    end = min(a.points[-1].step, b.points[-1].step)
    return a.accuracy_at_step(end), b.accuracy_at_step(end)


def _paired(a: Sequence[Any], b: Sequence[Any]) -> dict[str, Any]:
    """a - b per seed (``a[i]`` and ``b[i]``: the runs of one seed) at equal rollouts and at equal
    optimiser steps, each with its mean and 95% t interval over seeds (``pipeline.intervals``'s
    ``over_seeds`` of the per-seed differences: the two runs of a seed share the model, the
    prompts and their order, and the held-out draws; below ``MIN_SEEDS`` seeds: no interval)."""
    from pipeline.intervals import over_seeds

    out: dict[str, Any] = {}
    for name, at in (("equal_rollouts", _at_equal_rollouts), ("equal_steps", _at_equal_steps)):
        pairs = [at(x, y) for x, y in zip(a, b)]
        out[f"{name}_difference"] = [x - y for x, y in pairs]
        interval = over_seeds([x - y for x, y in pairs])  # the pairing kept: one difference per seed
        out[f"{name}_interval"] = {k: _finite(v) for k, v in asdict(interval).items()}
    return out


def _finite(x: Any) -> Any:
    """JSON has no nan: None in its place."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Per seed: a / b for the costs (a target either run missed is left out), a - b for the final accuracy."""
    out: dict[str, Any] = {
        key: {k: [x / y for x, y in zip(a[key][k], b[key][k]) if x is not None and y] for k in a[key]}
        for key in ("to_target", "cpu_to_target")
    }
    out["cpu_per_rollout"] = [x / y for x, y in zip(a["cpu_per_rollout"], b["cpu_per_rollout"])]
    out["final_difference"] = [x - y for x, y in zip(a["final"], b["final"])]
    return out


def _ms(values: Sequence[float | None], scale: float = 1.0, digits: int = 0) -> str:
    """Mean ± std of the reached values, and how many were reached when not all."""
    got = [v * scale for v in values if v is not None]
    if not got:
        return f"not reached (0 of {len(values)})"
    mean = sum(got) / len(got)
    sd = math.sqrt(sum((x - mean) ** 2 for x in got) / (len(got) - 1)) if len(got) > 1 else 0.0
    text = f"{mean:.{digits}f} ± {sd:.{digits}f}"
    return text if len(got) == len(values) else f"{text} ({len(got)} of {len(values)} reached)"


def markdown(spec: Any, runs: Sequence[Any], s: dict[str, Any]) -> str:
    """The report: the table of means, the ratios, then every run."""
    lines = [
        f"# bench trl: GRPOTrainer against GatedGRPOTrainer{' and CGRPOTrainer' if 'cgrpo' in s else ''} ({spec.label})",
        "",
        f"Seeds {', '.join(map(str, s['seeds'])) or '(none complete yet)'}; {spec.prompts_per_step} prompts x {spec.group_size} completions a "
        f"step; budget {spec.budget} rollouts a run; held-out accuracy every {spec.eval_every} rollouts on "
        f"{spec.eval_prompts} prompts x {spec.eval_samples} samples; {spec.threads} torch thread(s); "
        f"learning rate {spec.learning_rate} (constant).",
        "",
        "| trainer | start | rollouts to start + 0.1 | rollouts to start + 0.2 | CPU-s to start + 0.1 | "
        "CPU-s to start + 0.2 | final accuracy | CPU-ms / rollout | steps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    trainers = ("grpo", "gated") + (("cgrpo",) if "cgrpo" in s else ())
    for trainer in trainers:
        t = s[trainer]
        lines.append(
            f"| {trainer} | {_ms(t['start'], digits=3)} | {_ms(t['to_target']['0.1'])} | "
            f"{_ms(t['to_target']['0.2'])} | {_ms(t['cpu_to_target']['0.1'], digits=1)} | "
            f"{_ms(t['cpu_to_target']['0.2'], digits=1)} | {_ms(t['final'], digits=3)} | "
            f"{_ms(t['cpu_per_rollout'], 1000, 2)} | {_ms(t['steps'])} |"
        )
    lines += ["", _ratio_line("Gated / GRPO", s["ratio"]), "", _paired_line("Gated − GRPO", s["ratio"])]
    if "cgrpo" in s:
        seeds = ", ".join(map(str, s["cgrpo_seeds"]))
        lines.append(f"{_ratio_line('C-GRPO / GRPO', s['ratio_cgrpo'])[:-1]} (seeds {seeds}).")
        lines += ["", f"{_paired_line('C-GRPO − GRPO', s['ratio_cgrpo'])[:-1]} (seeds {seeds})."]
    lines.append("")
    if not s["seeds"]:  # a report written while the first seed is still running
        lines[4:] = ["No seed has run both trainers yet: the means and ratios come when one has.", ""]
    lines += [
        "| trainer | seed | rollouts | steps | to + 0.1 | to + 0.2 | final (95% CI over prompts) | CPU-s | CPU-ms / rollout | skipped | abandoned |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {"grpo": 0, "gated": 1, "cgrpo": 2}
    for run in sorted(runs, key=lambda r: (r.seed, order.get(r.trainer, 3))):
        start = next((x for x in runs if x.trainer == "grpo" and x.seed == run.seed), run).points[0].accuracy
        to = [run.rollouts_to(start + t) for t in TARGETS]
        last = run.points[-1]
        lines.append(
            f"| {run.trainer} | {run.seed} | {run.rollouts} | {run.steps} | "
            + " | ".join("-" if x is None else f"{x:.0f}" for x in to)
            + f" | {_accuracy_cell(last)} | {run.cpu_s:.0f} | {1000 * run.cpu_per_rollout:.2f} | "
            f"{_count(run.gate, 'railgate/prompts_skipped')} | {_count(run.gate, 'railgate/groups_abandoned')} |"
        )
    if any(x.trace_sigma is not None for r in runs for x in r.step_logs):
        lines += ["", *regime_lines(runs)]
    if any(r.trainer == "cgrpo" for r in runs):
        lines += [
            "",
            "C-GRPO's rollouts include its calibration draws (`cgrpo/calibration_rollouts` in its run's gate "
            "figures); it neither skips prompts nor abandons groups, it stops sampling a prompt early.",
        ]
    return "\n".join(lines) + "\n"


def _ratio_line(title: str, r: dict[str, Any]) -> str:
    return (
        f"{title}, per seed: rollouts to start + 0.1 {_ms(r['to_target']['0.1'], digits=2)}, to start + 0.2 "
        f"{_ms(r['to_target']['0.2'], digits=2)}; training CPU-seconds to start + 0.1 "
        f"{_ms(r['cpu_to_target']['0.1'], digits=2)}, to start + 0.2 {_ms(r['cpu_to_target']['0.2'], digits=2)}; "
        f"CPU-s per generated rollout {_ms(r['cpu_per_rollout'], digits=2)}; final accuracy difference "
        f"{_ms(r['final_difference'], digits=3)}, {_ms(r['equal_rollouts_difference'], digits=3)} at equal "
        "rollouts (the earlier of the two runs' ends)."
    )


def _accuracy_cell(point: Point) -> str:
    """An evaluation's accuracy with its 95% interval, within [0, 1].

    >>> _accuracy_cell(Point(0, 0, 0.0, 0.055, 0.07, 0))
    '0.055 (95% 0.000 to 0.125)'
    """
    lo, hi = max(0.0, point.accuracy - point.ci95), min(1.0, point.accuracy + point.ci95)
    return f"{point.accuracy:.3f} (95% {lo:.3f} to {hi:.3f})"


def _paired_line(title: str, r: dict[str, Any]) -> str:
    """The paired differences of ``_paired``: mean and 95% interval over seeds, then each seed's.

    >>> r = {"equal_rollouts_difference": [0.02, 0.04, 0.03],
    ...      "equal_rollouts_interval": {"mean": 0.03, "lo": -0.1, "hi": 0.16},
    ...      "equal_steps_difference": [0.05, 0.01], "equal_steps_interval": {"mean": 0.03, "lo": None, "hi": None}}
    >>> _paired_line("Gated − GRPO", r)  # doctest: +NORMALIZE_WHITESPACE
    'Gated − GRPO in held-out accuracy, paired by seed (mean, 95% t interval over seeds): at equal rollouts
    +0.030 (± 0.130: 95% -0.100 to +0.160; seeds +0.020, +0.040, +0.030); at equal optimiser steps +0.030 (2 seeds:
    too few for an interval over seeds, 3 at least; seeds +0.050, +0.010).'
    """
    from pipeline.intervals import MIN_SEEDS

    parts = []
    for name, words in (("equal_rollouts", "at equal rollouts"), ("equal_steps", "at equal optimiser steps")):
        i, per_seed = r[f"{name}_interval"], ", ".join(f"{d:+.3f}" for d in r[f"{name}_difference"])
        if not per_seed:
            parts.append(f"{words}: no seed yet")
            continue
        if i["lo"] is None:
            n = len(r[f"{name}_difference"])
            within = (
                "one seed: no interval"
                if n == 1
                else f"{n} seeds: too few for an interval over seeds, {MIN_SEEDS} at least"
                if n < MIN_SEEDS
                else "no interval"
            )
        else:
            within = f"± {(i['hi'] - i['lo']) / 2:.3f}: 95% {i['lo']:+.3f} to {i['hi']:+.3f}"
        parts.append(f"{words} {i['mean']:+.3f} ({within}; seeds {per_seed})")
    return f"{title} in held-out accuracy, paired by seed (mean, 95% t interval over seeds): " + "; ".join(parts) + "."


def run_regime(run: Any) -> dict[str, Any]:
    """One run's gradient noise scale over its steps (``railgate.regime.NoiseScaleLog``: the ratio
    of the run means of the steps' tr(Σ) and |G|² estimates, with Fieller's 95% interval), the rows
    a step trains, the regime and its sentence; ``regime`` is ``not measured`` for a run whose
    steps logged no estimates (records written before they were kept).

    >>> from railgate.bench.trl import RunRecord
    >>> logs = [StepLog(i, 64 * i, 0, 1.0, 0.5, 4, trace_sigma=t, grad_dot_prev=g, rows_trained=64.0)
    ...         for i, (t, g) in enumerate([(40.0, 1.0), (24.0, 1.0), (32.0, 1.0)], 2)]
    >>> r = run_regime(RunRecord("grpo", 0, [], 256, 0, 1.0, 1.0, 0.0, 4, {}, logs))
    >>> r["noise_scale"], r["rows"], r["regime"]
    (32.0, 64.0, 'step-limited')
    """
    from railgate.regime import NoiseScaleLog, regime, regime_sentence

    log = NoiseScaleLog()
    for x in run.step_logs:
        if x.trace_sigma is not None and x.grad_dot_prev is not None:
            log(
                x.step,
                {
                    "learner/trace_sigma": x.trace_sigma,
                    "learner/grad_dot_prev": x.grad_dot_prev,
                    "learner/rollouts_trained": x.rows_trained,
                },
            )
    m = log.summary()
    rows, noise, low, high = m["batch_rollouts"], m["noise_scale"], m["noise_scale_low"], m["noise_scale_high"]
    return {
        "noise_scale": noise,
        "low": low,
        "high": high,
        "rows": rows,
        "steps": m["noise_scale_steps"],
        "regime": regime(rows, noise, low),
        "sentence": regime_sentence(rows, noise, low, high, steps=int(m["noise_scale_steps"] or 0), unit="rows"),
    }


def regime_lines(runs: Sequence[Any]) -> list[str]:
    """The report's paragraph on the regime: each run's noise scale in words (rows: completions
    trained per optimiser step, a gated step's zero-advantage pad rows included; B / B_simple is
    the same with or without them, see ``railgate.trl.noise``)."""
    order = {"grpo": 0, "gated": 1, "cgrpo": 2}
    lines = ["Regime, from each run's gradient noise scale (`railgate.trl.noise`, run means, 95% interval):", ""]
    for run in sorted(runs, key=lambda r: (r.seed, order.get(r.trainer, 3))):
        lines.append(f"- {run.trainer}, seed {run.seed}: {run_regime(run)['sentence']}")
    return lines


def _count(gate: dict[str, float], key: str) -> str:
    return f"{gate[key]:.0f}" if key in gate else "-"


def figure(spec: Any, runs: Sequence[Any], path: Path) -> None:
    """Held-out accuracy against generated rollouts, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colours = {"grpo": "tab:grey", "gated": "tab:blue", "cgrpo": "tab:orange"}
    for run in runs:
        ax.plot(
            [p.rollouts for p in run.points],
            [p.accuracy for p in run.points],
            color=colours[run.trainer],
            linestyle="-" if run.trainer == "gated" else "--",
            alpha=0.8,
            label=f"{NAMES.get(run.trainer, run.trainer)} seed {run.seed}",
        )
    ax.set_xlabel("rollouts generated")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(f"bench trl ({spec.label}): {spec.prompts_per_step} prompts x {spec.group_size} a step", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
