"""The allocation benchmark's report: per-policy summaries over seeds, the regime notes and the
markdown text of ``allocation.md`` (``railgate.bench.allocation`` runs the grid)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from railgate.bench.paired import difference, final_accuracy, reference_of
from railgate.bench.policies import order


def to_target(curve: list[tuple], target: float) -> tuple[float, float, float]:
    """(rollouts, tokens, seconds) where accuracy first reaches ``target``, linearly interpolated
    between the evaluation before and the first one at or above it; NaNs if never.

    >>> [round(x, 6) for x in to_target([(0, 0, 0.0, 0.3, 0), (100, 1000, 10.0, 0.5, 1)], 0.4)]
    [50.0, 500.0, 5.0]
    >>> to_target([(0, 0, 0.0, 0.3, 0)], 0.4)
    (nan, nan, nan)
    """
    previous = None
    for point in curve:
        accuracy = point[3]
        if accuracy >= target:
            if previous is None or previous[3] >= accuracy:
                return float(point[0]), float(point[1]), float(point[2])
            w = (target - previous[3]) / (accuracy - previous[3])
            return tuple(float(previous[i] + w * (point[i] - previous[i])) for i in range(3))  # type: ignore[return-value]
        previous = point
    return math.nan, math.nan, math.nan


def summarise(results: list[dict[str, Any]], target_gain: float) -> list[dict[str, Any]]:
    """One row per (scenario, model, policy): means and spreads over seeds.

    The target is the policy-independent start accuracy (mean of every run's first evaluation
    in the panel for that seed) + ``target_gain``. Columns no run has values for are dropped.
    """
    by_key: dict[tuple, dict[int, dict[str, Any]]] = {}
    for r in results:
        by_key.setdefault((r["scenario"], r["model"], r["policy"]), {})[r["seed"]] = r
    start: dict[tuple, list[float]] = {}
    for r in results:
        start.setdefault((r["scenario"], r["model"], r["seed"]), []).append(r["curve"][0][3])

    def target(scenario: str, model: str, seed: int) -> float:
        return float(np.mean(start[(scenario, model, seed)])) + target_gain

    rows = []
    panels: dict[tuple, list[dict[str, Any]]] = {}
    for r in results:
        panels.setdefault((r["scenario"], r["model"]), []).append(r)
    for (scenario, model, policy), per_seed in sorted(
        by_key.items(), key=lambda kv: (kv[0][0], kv[0][1], order(kv[0][2]))
    ):

        def ref(name: str, seed: int, scenario: str = scenario, model: str = model) -> float:
            other = by_key.get((scenario, model, name), {}).get(seed)
            if other is None:
                return math.nan
            return to_target(other["curve"], target(scenario, model, seed))[0]

        reach, tokens, seconds, ratios = [], [], [], {"uniform": [], "ds": [], "oracle": []}
        for seed, r in per_seed.items():
            ro, to, se = to_target(r["curve"], target(scenario, model, seed))
            reach.append(ro)
            tokens.append(to)
            seconds.append(se)
            for name in ratios:
                ratios[name].append(ro / ref(name, seed))
        runs = list(per_seed.values())
        ctl = [r.get("controller") or {} for r in runs]
        rows.append(
            {
                "scenario": scenario or runs[0].get("engine", ""),
                "model": model or "real",
                "policy": policy,
                "seeds": len(per_seed),
                "reached": sum(1 for x in reach if not math.isnan(x)),
                "rollouts to target": _ms(reach),
                "tokens to target": _ms(tokens),
                "seconds to target": _ms(seconds, digits=1),
                "vs GRPO": _ms(ratios["uniform"]),
                "vs DS": _ms(ratios["ds"]),
                "vs oracle": _ms(ratios["oracle"]),
                "final acc": _ms([r["curve"][-1][3] for r in runs], digits=3),
                "final acc (95%, seeds x prompts)": final_accuracy(panels[(scenario, model)], policy),
                "final acc - GRPO (95%, paired)": difference(panels[(scenario, model)], policy, reference)
                if (reference := reference_of([r["policy"] for r in panels[(scenario, model)]]))
                else "n/a",
                "hardest acc": _ms(
                    [r["curve"][-1][5] if len(r["curve"][-1]) > 5 else math.nan for r in runs], digits=3
                ),
                "yield": _ms([r["effective_yield"] for r in runs], digits=2),
                "false abandon": _ms([r["false_abandonment"] for r in runs], digits=3),
                "recovered (all-fail)": _ms([_count(c, "controller/recovered_fail") for c in ctl], digits=1),
                "recovered (all-pass)": _ms([_count(c, "controller/recovered_pass") for c in ctl], digits=1),
                "interventions": _ms([_count(c, "controller/interventions") for c in ctl], digits=0),
                "decision p50 µs": _ms([c.get("controller/decision_p50_us", math.nan) for c in ctl], digits=0),
                "decision p99 µs": _ms([c.get("controller/decision_p99_us", math.nan) for c in ctl], digits=0),
                "gain error vs frozen": _ms(
                    [-c.get("controller/gain_error_reduction", math.nan) for c in ctl], digits=2
                ),
                "steps": _ms([r["steps"] for r in runs], digits=0),
                "noise scale": _ms([_value(r, "noise_scale") for r in runs], digits=0),
                "noise scale 95%": _interval(runs, "noise_scale"),
                "batch / noise scale": _ms(
                    [_value(r, "batch_rollouts") / _value(r, "noise_scale") for r in runs], digits=2
                ),
                "noise scale (micro-batches)": _ms([_value(r, "noise_scale_micro") for r in runs], digits=0),
                "micro-batches 95%": _interval(runs, "noise_scale_micro"),
            }
        )
    empty = [h for h in rows[0] if all(row[h] == "n/a" for row in rows)] if rows else []
    return [{k: v for k, v in row.items() if k not in empty} for row in rows]


def _value(run: dict[str, Any], key: str) -> float:
    """A run record's number (NaN when absent or null: the simulator has no noise scale)."""
    value = run.get(key)
    return float(value) if isinstance(value, (int, float)) else math.nan


def _interval(runs: list[dict[str, Any]], prefix: str) -> str:
    """The widest 95% interval of the runs' noise scales (``prefix``: ``noise_scale`` from
    consecutive steps, ``noise_scale_micro`` from the micro-batches); 'n/a' where none was measured."""
    if not any(r.get(f"{prefix}_steps") for r in runs):
        return "n/a"
    lows = [_value(r, f"{prefix}_low") for r in runs]
    highs = [_value(r, f"{prefix}_high") for r in runs]
    if not any(math.isfinite(v) for v in lows):
        return "unresolved"  # no seed's run mean of |G|² stands above its noise
    low = min(v for v in lows if math.isfinite(v))
    high = "unbounded" if any(not math.isfinite(v) for v in highs) else f"{max(highs):.0f}"
    return f"{low:.0f} to {high}"


def regime_notes(results: list[dict[str, Any]]) -> list[str]:
    """One note per panel with a measured noise scale: what it means for that setting, from
    GRPO's runs (uniform) when there are some, else from every run of the panel."""
    from railgate.regime import combine, regime_text

    notes = []
    for scenario, model in sorted({(r["scenario"], r["model"]) for r in results}):
        panel = [r for r in results if (r["scenario"], r["model"]) == (scenario, model)]
        runs = [r for r in panel if r["policy"] == "uniform"] or panel
        if not any(r.get("noise_scale_steps") or r.get("noise_scale_micro_steps") for r in runs):
            continue
        who = "GRPO's runs" if runs[0]["policy"] == "uniform" else "all runs"
        name = f"{scenario}, {model}" if scenario else f"real model ({panel[0].get('engine', '')})"
        notes.append(f"{name[:1].upper()}{name[1:]}, {who}: {regime_text(combine(runs))}")
    return notes


def _count(controller_metrics: dict[str, float], key: str) -> float:
    """A controller's count (0 when it never happened); NaN for a run without a controller."""
    return float(controller_metrics.get(key, 0.0)) if controller_metrics else math.nan


def _ms(values: Iterable[float], digits: int | None = None) -> str:
    """'mean ± std' over the finite values, with '(k not reached)' when some are missing."""
    vals = [float(v) for v in values]
    finite = [v for v in vals if math.isfinite(v)]
    missing = len(vals) - len(finite)
    if not finite:
        return "n/a"
    mean, std = float(np.mean(finite)), float(np.std(finite))
    if digits is None:
        digits = 0 if abs(mean) >= 100 else 2
    text = f"{mean:.{digits}f} ± {std:.{digits}f}"
    return text + (f" ({missing} not reached)" if missing else "")


def report_text(results: list[dict[str, Any]], target_gain: float, title: str, setup: str, wall_s: float) -> str:
    """The markdown report of a benchmark's results (also for re-summarising a saved allocation.json)."""
    from railgate.report import markdown_table

    rows = summarise(results, target_gain)
    headers = list(rows[0].keys())
    table = markdown_table(headers, [[r[h] for h in headers] for r in rows])
    notes = regime_notes(results)
    regime = (
        (
            "\n**Regime.** 'noise scale' is the learner's simple gradient noise scale (McCandlish et al. 2018) in "
            "rollouts, per run the run mean of tr(Σ) over the run mean of |G|², from consecutive steps' gradients "
            "(|G|² as the mean of G_t · G_(t-1)); mean ± std over seeds, '95%' the widest of the seeds' Fieller "
            "intervals; 'batch / noise scale' the rollouts trained per step over it; '(micro-batches)' the same from "
            "the micro-batches within each step (biased far below the noise scale). " + " ".join(notes) + "\n"
        )
        if notes
        else ""
    )
    return (
        f"# {title}\n\n{setup}, target = start accuracy + "
        f"{target_gain}; ratios are per seed (rollouts to target / the reference's), mean ± std. "
        f"'gain error vs frozen' is the online controller's mean absolute gain-prediction error relative to a frozen "
        f"copy's minus 1 (negative: the online one is better). 'final acc' is each run's last evaluation, mean ± std "
        f"over seeds; '(95%, seeds x prompts)' its mean over seeds and held-out prompts with a 95% interval over both, "
        f"and 'final acc - GRPO' the paired difference from GRPO's run of the same seed (same prompts, same random "
        f"draws), with its 95% interval over seeds and prompts (railgate/bench/paired.py). "
        f"Wall clock {wall_s:.0f} s.\n\n{table}\n{regime}"
    )
