"""Markdown tables for the end of a run and for benchmarks."""

from __future__ import annotations

import math
from typing import Any, Sequence

from pipeline.orchestrator import RunSummary


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
        ["held-out accuracy at start", float(first.get("eval/accuracy", math.nan))],
        ["held-out accuracy at end", float(last.get("eval/accuracy", math.nan))],
        ["rollouts started", int(m["pipeline/rollouts_started"])],
        ["rollouts aborted", int(m["pipeline/rollouts_aborted"])],
        ["rollouts failed (engine)", int(m["pipeline/rollouts_failed"])],
        ["tokens generated", int(m["pipeline/tokens_generated"])],
        ["tokens wasted (not trained on)", int(m["pipeline/tokens_wasted"])],
        ["groups opened / committed / abandoned", f"{int(m['pipeline/groups_opened'])} / {int(m['pipeline/groups_committed'])} / {int(m['pipeline/groups_abandoned'])}"],
        ["effective-group yield", m["pipeline/effective_yield"]],
        ["rollouts per effective group", m["pipeline/rollouts_per_effective_group"]],
        ["staleness mean / max", f"{m['pipeline/staleness_mean']:.2f} / {int(m['pipeline/staleness_max'])}"],
        ["reward errors / timeouts", f"{int(m['pipeline/reward_errors'])} / {int(m['pipeline/reward_timeouts'])}"],
    ]
    title = f"## Run {getattr(cfg, 'name', '')}\n\n"
    return title + markdown_table(["metric", "value"], rows)
