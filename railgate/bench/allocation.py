"""``python run.py bench allocation``: every allocation policy side by side on the simulator.

For each scenario (configs/scenarios/), each training model of the sim (progress counts the
effective groups: ``progress_exponent=1``; normalised optimiser steps: ``progress_exponent=0.1``)
and each seed, every policy trains on the same seeded world until the same rollout budget is
spent, with an exact held-out evaluation after every step. Reported per policy, mean and spread
over seeds:

* rollouts and tokens to the target accuracy (start accuracy + ``target_gain``), and their
  ratios to uniform GRPO, to DAPO dynamic sampling and to the oracle floor (ratios per seed);
* final accuracy at the equal budget; effective-group yield (effective groups trained / groups
  opened);
* false abandonment: for each group abandoned before it was complete, the exact probability
  (from the sim's true success rate at that moment) that completing it would have made it
  mixed -- the expectation of "complete the abandoned group and look", without sampling noise;
* step latency in engine time (simulated seconds per learner step).

Writes ``allocation.md`` (tables), ``allocation.json`` (every run) and ``allocation.png``
(accuracy against cumulative rollouts, one line per policy, one panel per scenario/model).
"""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

DEFAULT_POLICIES = ("uniform", "ds", "pilot_commit", "hora", "sara", "sara_eager", "sara_stream", "dps", "sara_dps", "oracle")
MODELS = {"effective": 1.0, "normalised": 0.1}
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RunSpec:
    """One training run of the benchmark grid."""

    base_config: str
    scenario: str
    model: str
    policy: str
    seed: int
    budget: int

    def overrides(self) -> list[str]:
        kind = "sara" if self.policy in ("sara_eager", "sara_stream") else self.policy
        out = [
            f"gate.kind={kind}",
            f"seed={self.seed}",
            f"sim.seed={self.seed}",
            f"sim.progress_exponent={MODELS[self.model]}",
            "orchestrator.steps=1000000",
            f"orchestrator.max_rollouts={self.budget}",
            "orchestrator.eval_every=1",
        ]
        if self.policy == "sara_eager":
            out.append("gate.sara.launch=eager")
        if self.policy == "sara_stream":
            out.append("gate.sara.launch=streaming")
        return out


class GateProbe:
    """Wraps a gate to measure false abandonment exactly in the sim (benchmark only)."""

    def __init__(self, gate: Any, world: Any, engine: Any):
        self._gate = gate
        self._world = world
        self._engine = engine
        self._last: dict[int, Any] = {}
        self.abandoned_incomplete = 0
        self.false_abandonment_sum = 0.0

    def admit(self, slots: int, step: int):
        return self._gate.admit(slots, step)

    def update(self, snapshot):
        self._last[snapshot.group_id] = snapshot
        actions = self._gate.update(snapshot)
        for action in actions:
            if action.kind.value == "abandon":
                self._measure(self._last.get(action.group_id))
        return actions

    def _measure(self, snap) -> None:
        if snap is None or snap.finished >= snap.target_size or snap.is_mixed or snap.finished == 0:
            return
        p = self._world.success_probability(self._engine.state, snap.prompt.prompt_id)
        m = snap.target_size - snap.finished
        all_success = snap.successes == snap.finished
        self.abandoned_incomplete += 1
        self.false_abandonment_sum += 1.0 - (p**m if all_success else (1.0 - p) ** m)

    def on_closed(self, group_id: int, committed: bool) -> None:
        self._last.pop(group_id, None)
        self._gate.on_closed(group_id, committed)

    def on_step(self, step: int, batch):
        return self._gate.on_step(step, batch)

    def state_dict(self):
        return self._gate.state_dict()

    def load_state_dict(self, state) -> None:
        self._gate.load_state_dict(state)

    def metrics(self) -> dict[str, float]:
        inner = getattr(self._gate, "metrics", None)
        return inner() if callable(inner) else {}


def run_one(spec: RunSpec) -> dict[str, Any]:
    """Train one policy on one seeded world until the budget is spent; the eval curve and costs."""
    import anyio

    from pipeline.orchestrator import Orchestrator
    from pipeline.scoring import ScoringService
    from railgate.build import build_components
    from railgate.config import load_config
    from railgate.train import tune_gc

    tune_gc()
    scenario_data = _scenario(spec.scenario)
    from pipeline.configuration import load_yaml, merge

    base = merge(load_yaml(spec.base_config), scenario_data)
    cfg = load_config(None, spec.overrides(), base=base)
    comps = build_components(cfg)
    probe = GateProbe(comps.gate, comps.world, comps.engine)
    orch = Orchestrator(
        engine=comps.engine, gate=probe, controller=comps.controller,
        scoring=ScoringService(comps.scorer, 5.0, 1), learner=comps.learner, config=cfg.orchestrator,
        evaluator=comps.evaluator, clock=comps.clock, seed=cfg.seed, run_id=f"{spec.policy}-{spec.seed}",
    )
    started = time.perf_counter()
    summary = anyio.run(orch.run)
    m = summary.budget.as_metrics()
    return {
        "scenario": spec.scenario, "model": spec.model, "policy": spec.policy, "seed": spec.seed,
        "budget": spec.budget, "steps": summary.steps, "wall_s": time.perf_counter() - started,
        # The oracle's saturated draws are booked as uncounted (perfect foresight skips them).
        "curve": [(e["pipeline/rollouts_started"] - e.get("gate/uncounted_rollouts", 0.0),
                   e["pipeline/tokens_generated"] - e.get("gate/uncounted_tokens", 0.0),
                   e["pipeline/engine_time"], e["eval/accuracy"], e["step"]) for e in summary.evals],
        "effective_yield": (m["pipeline/groups_effective"] / max(1.0, m["pipeline/groups_opened"] - probe.metrics().get("gate/uncounted", 0.0))),
        "rollouts": m["pipeline/rollouts_started"], "tokens": m["pipeline/tokens_generated"],
        "false_abandonment": (probe.false_abandonment_sum / probe.abandoned_incomplete) if probe.abandoned_incomplete else math.nan,
        "abandoned_incomplete": probe.abandoned_incomplete,
    }


def _scenario(name: str) -> dict[str, Any]:
    from pipeline.configuration import ConfigError, load_yaml

    path = ROOT / "configs" / "scenarios" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (ROOT / "configs" / "scenarios").glob("*.yaml"))
        raise ConfigError(f"unknown scenario {name!r}; choose from {', '.join(known)}")
    return load_yaml(path)


def to_target(curve: list[tuple], target: float) -> tuple[float, float]:
    """(rollouts, tokens) at the first evaluation reaching ``target``; (nan, nan) if never."""
    for rollouts, tokens, _, accuracy, _ in curve:
        if accuracy >= target:
            return rollouts, tokens
    return math.nan, math.nan


def summarise(results: list[dict[str, Any]], target_gain: float) -> list[dict[str, Any]]:
    """One row per (scenario, model, policy): means and spreads over seeds."""
    by_key: dict[tuple, dict[int, dict[str, Any]]] = {}
    for r in results:
        by_key.setdefault((r["scenario"], r["model"], r["policy"]), {})[r["seed"]] = r
    rows = []
    for (scenario, model, policy), per_seed in sorted(by_key.items(), key=lambda kv: (kv[0][0], kv[0][1], _order(kv[0][2]))):
        def ref(name: str, seed: int) -> float:
            other = by_key.get((scenario, model, name), {}).get(seed)
            if other is None:
                return math.nan
            return to_target(other["curve"], other["curve"][0][3] + target_gain)[0]

        reach, tokens, ratios = [], [], {"uniform": [], "ds": [], "oracle": []}
        for seed, r in per_seed.items():
            ro, to = to_target(r["curve"], r["curve"][0][3] + target_gain)
            reach.append(ro)
            tokens.append(to)
            for name in ratios:
                ratios[name].append(ro / ref(name, seed))
        steps = [r["steps"] for r in per_seed.values()]
        latency = [r["curve"][-1][2] / max(1, r["steps"]) for r in per_seed.values()]
        rows.append({
            "scenario": scenario, "model": model, "policy": policy, "seeds": len(per_seed),
            "reached": sum(1 for x in reach if not math.isnan(x)),
            "rollouts to target": _ms(reach), "tokens to target": _ms(tokens),
            "vs GRPO": _ms(ratios["uniform"]), "vs DS": _ms(ratios["ds"]), "vs oracle": _ms(ratios["oracle"]),
            "final acc": _ms([r["curve"][-1][3] for r in per_seed.values()], digits=3),
            "yield": _ms([r["effective_yield"] for r in per_seed.values()], digits=2),
            "false abandon": _ms([r["false_abandonment"] for r in per_seed.values()], digits=3),
            "engine s/step": _ms(latency, digits=3),
            "steps": _ms(steps, digits=0),
        })
    return rows


def _order(policy: str) -> int:
    return DEFAULT_POLICIES.index(policy) if policy in DEFAULT_POLICIES else len(DEFAULT_POLICIES)


def _ms(values: Iterable[float], digits: int | None = None) -> str:
    """'mean ± std' over the finite values, with '(k nan)' when some are missing."""
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


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["scenario"], r["model"]) for r in results})
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (scenario, model) in zip(axes[0], panels):
        rs = [r for r in results if r["scenario"] == scenario and r["model"] == model]
        budget = max(r["budget"] for r in rs)
        grid = np.linspace(0, budget, 200)
        for policy in sorted({r["policy"] for r in rs}, key=_order):
            curves = []
            for r in rs:
                if r["policy"] != policy:
                    continue
                x = np.array([c[0] for c in r["curve"]])
                y = np.array([c[3] for c in r["curve"]])
                curves.append(np.interp(grid, x, y, right=np.nan))
            # A plain mean: the line stops where any seed's run has ended (no survivor bias).
            ax.plot(grid, np.mean(np.array(curves), axis=0), label=policy)
        ax.set_title(f"{scenario}, {model} training model")
        ax.set_xlabel("cumulative rollouts")
        ax.set_ylabel("held-out accuracy (exact)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_allocation_bench(
    base_config: Path,
    out: Path,
    scenarios: list[str],
    policies: list[str],
    seeds: int,
    budget: int,
    target_gain: float,
    models: list[str],
    workers: int = 2,
) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    for model in models:
        if model not in MODELS:
            raise ValueError(f"unknown training model {model!r}; choose from {', '.join(MODELS)}")
    for scenario in scenarios:
        _scenario(scenario)  # fail fast on a typo
    specs = [
        RunSpec(str(base_config), scenario, model, policy, seed, budget)
        for scenario in scenarios for model in models for seed in range(seeds) for policy in policies
    ]
    from tqdm import tqdm

    results = []
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for result in tqdm(pool.map(run_one, specs), total=len(specs), desc="bench allocation"):
            results.append(result)
    rows = summarise(results, target_gain)
    headers = list(rows[0].keys())
    from railgate.report import markdown_table

    table = markdown_table(headers, [[r[h] for h in headers] for r in rows])
    text = (
        f"# Allocation benchmark\n\nbudget {budget} rollouts per run, {seeds} seeds, target = start accuracy + "
        f"{target_gain}; ratios are per seed (rollouts to target / the reference's), mean ± std. "
        f"Wall clock {time.perf_counter() - started:.0f} s.\n\n{table}\n"
    )
    (out / "allocation.md").write_text(text)
    (out / "allocation.json").write_text(json.dumps(results))
    plot(results, out / "allocation.png")
    print(text)
    print(f"written: {out / 'allocation.md'}, {out / 'allocation.png'}")
    return rows
