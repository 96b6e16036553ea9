"""``bench replay``'s figures per gate: yield, cost of a step, mistakes, selection, forecast.

For one log, every gate was replayed under the same orders (``pipeline.replay.order``: seed 0
as recorded, then seeded shuffles); ``log_report`` turns their outcomes into, per gate:

* informative (mixed, trained) groups per 1,000 generated rollouts and per million tokens, with
  paired bootstrap 95% intervals over the log's groups (each group's figures averaged over the
  orders first, then groups resampled, the same resamples for every gate,
  ``railgate.replay.bootstrap``), and the ratio of each gate's yield to whole groups'
  (``uniform``) and to DS's on the same resamples;
* rollouts and tokens to fill a learner step of ``batch`` informative groups, walking each
  order's outcomes in the order the gate opened them (replay order, but for DPS's own picks;
  mean over the steps filled, then over orders);
* wrong abandons: abandoned though the full group was mixed, as a share of the mixed groups
  opened; wasted commits: committed with all-same served samples, and committed though the
  full group is all-same (the same when the group size is the log's K), as shares of commits;
  mixed groups skipped (never opened: a screen, the oracle's draw), as a share of all mixed groups;
* when groups were decided: the histogram of samples ended at the gate's first verdict, the
  shares decided within 2 and 4;
* the pass-rate profile of what the gate trained on (recorded pass rates of its informative
  groups: mean and quartiles) against all mixed groups of the log: its selection bias;
* distinct source prompts trained and committed groups per distinct prompt (a log holds a prompt
  at several steps);
* the gate's own forecast of its yield where it has one (``railgate.replay.predicted``: the
  probing rule's, or the closed form on the log's fitted pass rates).

Figures in ``railgate.replay.figures``; definitions there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from controller.probing import fit_beta_binomial
from pipeline.replay.order import ReplayOrder
from railgate.config import RunConfig
from railgate.replay.bootstrap import ratio_intervals
from railgate.replay.driver import ReplayRun
from railgate.replay.figures import fill_cost, in_replay_order, prompt_figures
from railgate.replay.predicted import forecast, forecastable

UNIFORM, DS = "uniform", "ds"


def log_report(
    orders: Sequence[ReplayOrder],
    runs: Mapping[str, Sequence[ReplayRun]],
    configs: Mapping[str, RunConfig],
    group_size: int,
    batch: int,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Every replayed gate's figures (module docstring) as plain data, keyed by gate name."""
    log = orders[0].log
    figures = {g: [prompt_figures(o, r.outcomes, group_size) for o, r in zip(orders, rs)] for g, rs in runs.items()}
    pooled = {g: {k: np.mean([f[k] for f in fs], axis=0) for k in fs[0]} for g, fs in figures.items()}
    refs = tuple(r for r in (UNIFORM, DS) if r in runs)
    per_rollout = ratio_intervals(
        {g: p["informative"] for g, p in pooled.items()},
        {g: p["samples"] for g, p in pooled.items()},
        reference=refs,
        resamples=resamples,
        seed=seed,
    )
    per_token = ratio_intervals(
        {g: p["informative"] for g, p in pooled.items()},
        {g: p["tokens"] for g, p in pooled.items()},
        reference=refs,
        resamples=resamples,
        seed=seed,
    )
    rates = np.array([g.successes / g.size for g in log.groups])
    mixed_rates = rates[np.array([g.is_mixed for g in log.groups], dtype=bool)] if log.groups else rates
    beliefs = [run_belief(o, group_size) for o in orders]
    out: dict[str, Any] = {}
    for g, fs in figures.items():
        p = pooled[g]
        y, t = per_rollout[g], per_token[g]
        fills = [
            fill_cost(r.outcomes, in_replay_order(f, o, "informative"), batch, r.opened_order)
            for o, r, f in zip(orders, runs[g], fs)
        ]
        decided = np.concatenate([f["decided_at"][f["decided_at"] > 0] for f in fs])
        trained = np.concatenate([f["pass_rate"][f["informative"] > 0] for f in fs])
        distinct = [_distinct(o, f) for o, f in zip(orders, fs)]
        predicted = [
            forecast(configs[g], _scores(o), r.outcomes, group_size, r.metrics, beliefs[i])
            for i, (o, r) in enumerate(zip(orders, runs[g]))
        ]
        out[g] = {
            "orders": len(fs),
            "groups_opened": _total(p, "opened"),
            "groups_committed": _total(p, "committed"),
            "informative": _total(p, "informative"),
            "rollouts": _total(p, "samples"),
            "tokens": _total(p, "tokens"),
            "informative_per_1k_rollouts": _scaled(y, 1e3),
            "informative_per_1m_tokens": _scaled(t, 1e6),
            "yield_vs": {ref: list(v) for ref, v in y.versus.items()},
            "yield_per_token_vs": {ref: list(v) for ref, v in t.versus.items()},
            "fill_rollouts": _mean([f[0] for f in fills]),
            "fill_tokens": _mean([f[1] for f in fills]),
            "steps_filled": float(np.mean([f[2] for f in fills])),
            "wrong_abandons": _total(p, "wrong_abandon"),
            "wrong_abandon_share": _share(p["wrong_abandon"].sum(), (p["full_mixed"] * p["opened"]).sum()),
            "skipped_mixed_share": _share(p["skipped_mixed"].sum(), p["full_mixed"].sum()),
            "wasted_commits_served": _share(p["served_same"].sum(), p["committed"].sum()),
            "wasted_commits_full": _share(p["full_same"].sum(), p["committed"].sum()),
            "decided_histogram": {int(k): int(v) for k, v in zip(*np.unique(decided, return_counts=True))},
            "decided_within_2": _share((decided <= 2).sum(), len(decided)),
            "decided_within_4": _share((decided <= 4).sum(), len(decided)),
            "decided_mean": float(decided.mean()) if len(decided) else math.nan,
            "pass_rate_trained": _profile(trained),
            "pass_rate_all_mixed": _profile(mixed_rates),
            "distinct_prompts_trained": _mean([d[0] for d in distinct]),
            "commits_per_distinct_prompt": _mean([d[1] for d in distinct]),
            "forecast": _forecast(predicted, forecastable(configs[g])),
            "steps": float(np.mean([r.steps for r in runs[g]])),
            "gate_metrics": _mean_metrics([r.metrics for r in runs[g]]),
        }
    return out


def log_summary(orders: Sequence[ReplayOrder], group_size: int) -> dict[str, Any]:
    """What the log holds: groups, K, samples, mixed groups (full K, and of the first ``group_size``
    under each order)."""
    log = orders[0].log
    mixed_first = [
        sum(
            0
            < sum(s.reward > o.group(p.prompt_id).success_threshold for s in o.sample_order(p.prompt_id)[:group_size])
            < group_size
            for p in o.prompts
        )
        for o in orders
    ]
    return {
        "sources": list(log.sources),
        "format": log.format,
        "groups": len(log.groups),
        "group_size_recorded": log.group_size,
        "samples": log.samples,
        "source_prompts": len({g.prompt_id for g in log.groups}),
        "mixed_groups": sum(g.is_mixed for g in log.groups),
        "mixed_first_g": _mean(mixed_first),
        "with_reference_logprob": sum(g.reference_logprob is not None for g in log.groups),
        "skipped_rows": log.skipped_rows,
        "skipped_groups": log.skipped_groups,
        "notes": list(log.notes),
    }


def run_belief(order: ReplayOrder, group_size: int) -> tuple[float, float] | None:
    """The Beta of the log's pass rates (``controller.probing.fit_beta_binomial`` over each
    group's first ``group_size`` samples in ``order``): what a fixed-prior gate's forecast draws
    its rates from (``railgate.replay.predicted``); None for an empty log."""
    data = [
        (
            sum(
                s.reward > order.group(p.prompt_id).success_threshold
                for s in order.sample_order(p.prompt_id)[:group_size]
            ),
            group_size,
        )
        for p in order.prompts
    ]
    return fit_beta_binomial(data) if data else None


def _scores(order: ReplayOrder) -> list[float | None]:
    return [order.reference_logprob(p.prompt_id) for p in order.prompts]


def _distinct(order: ReplayOrder, f: dict[str, np.ndarray]) -> tuple[float, float]:
    groups = order.log.groups
    committed = np.flatnonzero(f["committed"] > 0)
    sources = {groups[i].prompt_id for i in committed}
    return float(len(sources)), (len(committed) / len(sources) if sources else math.nan)


def _forecast(predicted: list[dict[str, Any] | None], why_not: str) -> dict[str, Any]:
    if why_not or not predicted or predicted[0] is None:
        return {"reason": why_not or "none"}
    return {k: _mean([p[k] for p in predicted if p is not None]) for k in predicted[0]}


def _scaled(r: Any, scale: float) -> list[float]:
    return [r.value * scale, r.lo * scale, r.hi * scale]


def _total(p: dict[str, np.ndarray], key: str) -> float:
    """The sum over the log's groups of a figure averaged over orders (a mean per order)."""
    return float(p[key].sum())


def _share(part: float, whole: float) -> float:
    return float(part) / float(whole) if whole else math.nan


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def _profile(rates: np.ndarray) -> dict[str, float]:
    if len(rates) == 0:
        return {"n": 0, "mean": math.nan, "q25": math.nan, "median": math.nan, "q75": math.nan}
    q25, q50, q75 = np.percentile(rates, [25, 50, 75])
    return {
        "n": int(len(rates)),
        "mean": float(rates.mean()),
        "q25": float(q25),
        "median": float(q50),
        "q75": float(q75),
    }


def _mean_metrics(metrics: Sequence[Mapping[str, float]]) -> dict[str, float]:
    keys = sorted({k for m in metrics for k in m})
    return {k: _mean([m[k] for m in metrics if k in m]) for k in keys}
