"""Markdown tables for the end of a run and for benchmarks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.shells.orchestrator import RunSummary


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table; floats get 4 significant digits.

    >>> print(markdown_table(["a", "b"], [[1, 0.123456]]))
    | a | b |
    |---|---|
    | 1 | 0.1235 |
    """

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "nan" if math.isnan(v) else f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def summary_table(cfg: Any, summary: RunSummary) -> str:
    """The final summary of a training run: accuracy before/after and what it cost."""
    m = summary.budget.as_metrics()
    first = summary.evals[0] if summary.evals else {}
    last = summary.evals[-1] if summary.evals else {}
    rows = [
        ["steps", summary.steps],
        ["stop reason", summary.stop_reason],
        ["wall clock (s)", float(summary.wall_s)],
        ["held-out accuracy at start", accuracy_text(first)],
        ["held-out accuracy at end", accuracy_text(last)],
        ["rollouts started", int(m["pipeline/rollouts_started"])],
        [
            "rollouts started that no step trained on",
            _share(m["pipeline/rollouts_untrained"], m["pipeline/rollouts_started"]),
        ],
        ["rollouts aborted", int(m["pipeline/rollouts_aborted"])],
        ["rollouts failed (engine)", int(m["pipeline/rollouts_failed"])],
        ["tokens generated", int(m["pipeline/tokens_generated"])],
        ["tokens wasted (not trained on)", int(m["pipeline/tokens_wasted"])],
        [
            "groups opened / committed / abandoned",
            f"{int(m['pipeline/groups_opened'])} / {int(m['pipeline/groups_committed'])} / {int(m['pipeline/groups_abandoned'])}",
        ],
        ["effective-group yield", m["pipeline/effective_yield"]],
        ["rollouts per effective group", m["pipeline/rollouts_per_effective_group"]],
        ["staleness mean / max", f"{m['pipeline/staleness_mean']:.2f} / {int(m['pipeline/staleness_max'])}"],
        [
            "reward errors / timeouts / none",
            f"{int(m['pipeline/reward_errors'])} / {int(m['pipeline/reward_timeouts'])} / "
            f"{int(m.get('pipeline/rewards_none', 0))}",
        ],
    ]
    controller = {k: v for k, v in (summary.controller_metrics or {}).items()}
    if controller:
        rows += [
            [
                "controller decisions / interventions",
                f"{int(controller.get('controller/decisions', 0))} / {int(controller.get('controller/interventions', 0))}",
            ],
            ["controller mode at end", "live" if controller.get("controller/live") else "shadow"],
            [
                "saturated probes rescued (all-fail / all-pass)",
                f"{int(controller.get('controller/rescued_fail', 0))} / {int(controller.get('controller/rescued_pass', 0))}",
            ],
            [
                "  of them recovered (made mixed)",
                f"{int(controller.get('controller/recovered_fail', 0))} / {int(controller.get('controller/recovered_pass', 0))}",
            ],
        ]
    title = f"## Run {getattr(cfg, 'name', '')}\n\n"
    return title + markdown_table(["metric", "value"], rows) + regime_paragraph(cfg)


def accuracy_text(evaluation: dict[str, float]) -> str:
    """An evaluation's accuracy with its 95% interval over prompts, for tables.

    >>> accuracy_text({"eval/accuracy": 0.41, "eval/accuracy_lo": 0.39, "eval/accuracy_hi": 0.43})
    '0.410 (95% 0.390 to 0.430)'
    >>> accuracy_text({"eval/accuracy": 0.41}), accuracy_text({})
    ('0.410', 'nan')
    """
    accuracy = float(evaluation.get("eval/accuracy", math.nan))
    lo, hi = float(evaluation.get("eval/accuracy_lo", math.nan)), float(evaluation.get("eval/accuracy_hi", math.nan))
    if not math.isfinite(accuracy):
        return "nan"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{accuracy:.3f}"
    return f"{accuracy:.3f} (95% {lo:.3f} to {hi:.3f})"


def _share(part: float, whole: float) -> str:
    """``part (x% of whole)``.

    >>> _share(64, 512), _share(0, 0)
    ('64 (12.5%)', '0 (0.0%)')
    """
    return f"{int(part)} ({100 * part / whole if whole else 0.0:.1f}%)"


def regime_paragraph(cfg: Any) -> str:
    """The run's gradient noise scale in words, from ``metrics.jsonl`` in ``cfg.run_dir``; empty
    for a simulator run (no gradient) or a run directory without metrics."""
    from railgate.regime import NoiseScaleLog, regime_text

    run_dir = getattr(cfg, "run_dir", None)
    if not run_dir or getattr(getattr(cfg, "engine", None), "kind", "sim") == "sim":
        return ""
    noise = NoiseScaleLog.from_run_dir(run_dir).summary()
    if noise["batch_rollouts"] is None:
        return ""
    how = ""
    if noise["noise_scale_steps"] or noise["noise_scale_micro_steps"]:
        how = (
            " The noise scale is the simple gradient noise scale (McCandlish et al. 2018) in rollouts: the run mean "
            "of tr(Σ) over the run mean of |G|² from consecutive steps' gradients (Fieller's 95% interval)."
        )
    return f"\n\n**Regime.** {regime_text(noise)}{how}"


def accuracy_plot(evals: Sequence[dict[str, float]], path: Path, title: str = "") -> bool:
    """Held-out accuracy against cumulative rollouts (and per difficulty level when the evaluator
    reports levels) as a PNG; False when there is nothing to plot."""
    points = [e for e in evals if "eval/accuracy" in e and "pipeline/rollouts_started" in e]
    if not points:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [e["pipeline/rollouts_started"] for e in points]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(x, [e["eval/accuracy"] for e in points], marker="o", color="black", linewidth=2, label="all")
    levels = sorted({level for e in points for level in difficulty_levels(e)})
    for level in levels:
        ax.plot(
            x, [difficulty_levels(e).get(level, math.nan) for e in points], linewidth=1, alpha=0.8, label=f"d={level:g}"
        )
    ax.set_xlabel("cumulative rollouts")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def difficulty_levels(evaluation: dict[str, float]) -> dict[float, float]:
    """``{level: accuracy}`` from an evaluation's ``eval/accuracy/d=K`` entries.

    >>> difficulty_levels({"eval/accuracy": 0.5, "eval/accuracy/d=2": 0.4, "eval/accuracy/d=10": 0.1})
    {2.0: 0.4, 10.0: 0.1}
    """
    out = {}
    for key, value in evaluation.items():
        if key.startswith("eval/accuracy/d="):
            try:
                out[float(key.split("=", 1)[1])] = float(value)
            except ValueError:
                continue
    return out
