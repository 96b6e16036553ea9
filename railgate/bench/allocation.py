"""``python run.py bench allocation`` and ``bench rail``: policies side by side, equal budgets.

On the simulator, for each scenario (configs/scenarios/), each training model of the sim
(progress counts the effective groups: ``progress_exponent=1``; normalised optimiser steps:
``progress_exponent=0.1``) and each seed, every policy trains on the same seeded world until
the same rollout budget is spent, with an exact held-out evaluation after every step. On a real
model (``engine.kind: torch``, configs/bench_allocation_torch.yaml) one base model is
warm-started once into ``OUT/base_model`` and every run starts from it; held-out accuracy is
sampled every ``orchestrator.eval_every`` steps on the same prompts with the same random draws
for every policy of a seed (common draws: two policies' evaluations differ by what they learned).

Reported per policy, mean and spread over seeds:

* rollouts, tokens and seconds to the target accuracy (start accuracy + ``target_gain``,
  linearly interpolated between evaluations), and the rollout ratios to uniform GRPO, to DAPO
  dynamic sampling and to the oracle floor (ratios per seed);
* final accuracy at the equal budget, overall and on the hardest difficulty level; its mean
  over seeds and held-out prompts with a 95% interval over both, and its paired difference
  from GRPO's (same seed, same prompts, same random draws: ``railgate.bench.paired``);
  effective-group yield (effective groups trained / groups opened);
* sim only: false abandonment, for each group abandoned before it was complete, the exact
  probability (from the sim's true success rate at that moment) that completing it would have
  made it mixed -- the expectation of "complete the abandoned group and look", without noise;
* with a RAIL controller: recovered groups (saturated probes the gate would have abandoned,
  turned mixed by an intervention), interventions, decision latency p99 and the
  gain-prediction error of the online controller against a frozen copy.
* real model: the learner's gradient noise scale (``learner/noise_scale``, in rollouts; its
  mean over the run is each run record's ``noise_scale``, null on the simulator, which has no
  gradient) against the rollouts trained per step, and what it says about the regime
  (``railgate.regime``).

Writes ``allocation.md`` (tables: ``railgate.bench.allocation_report``), ``allocation.json`` (every run) and ``allocation.png``
(accuracy against cumulative rollouts, one line per policy, one panel per scenario/model).
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from configs import SCENARIO_DIR
from pipeline.config.build import ConfigError
from railgate.bench.allocation_report import regime_notes, report_text, summarise, to_target
from railgate.bench.base_model import ensure_shared_base_model
from railgate.bench.paired import RateLog
from railgate.bench.plots import plot
from railgate.bench.policies import base_overrides, overrides
from railgate.bench.probe import GateProbe

__all__ = [
    "MODELS",
    "BenchGrid",
    "RunSpec",
    "grid",
    "is_sim_config",
    "regime_notes",
    "report_text",
    "run_allocation_bench",
    "run_one",
    "summarise",
    "to_target",
]

MODELS = {"effective": 1.0, "normalised": 0.1}


@dataclass(frozen=True)
class RunSpec:
    """One training run of the benchmark grid (``scenario`` and ``model`` are sim-only)."""

    base_config: str
    scenario: str
    model: str
    policy: str
    seed: int
    budget: int
    base_model: str = ""
    """Real model: the shared warm-started base model directory."""
    run_dir: str = ""
    extra: tuple[str, ...] = ()
    """``--set`` overrides applied to every run, after the policy's own."""

    def overrides(self) -> list[str]:
        out = (
            overrides(self.policy)
            + base_overrides(self.policy)
            + [
                f"seed={self.seed}",
                "orchestrator.steps=1000000",
                f"orchestrator.max_rollouts={self.budget}",
            ]
        )
        if self.scenario:  # the simulator: every step is evaluated, exactly
            out += [f"sim.seed={self.seed}", f"sim.progress_exponent={MODELS[self.model]}", "orchestrator.eval_every=1"]
        if self.base_model:
            out.append(f"model.path={self.base_model}")
        if self.run_dir:
            out.append(f"run_dir={self.run_dir}")
        return out + list(self.extra)

    def config(self):
        from pipeline.config.build import load_yaml, merge
        from railgate.config import load_config

        base = load_yaml(self.base_config)
        if self.scenario:
            base = merge(base, _scenario(self.scenario))
        return load_config(None, self.overrides(), base=base)


def run_one(spec: RunSpec) -> dict[str, Any]:
    """Train one policy on one seeded world (or real model) until the budget is spent; the eval
    curve, costs, and what the gate and controller report."""
    import anyio

    from pipeline.shells.parts import RunOutputs
    from railgate.build import build_components, build_orchestrator
    from railgate.regime import NoiseScaleLog
    from railgate.train import tune_gc

    tune_gc()
    cfg = spec.config()
    comps = build_components(cfg, progress=False)
    world = getattr(comps.engine, "world", None)  # the simulator's
    sim = world is not None
    probe = GateProbe(comps.gate, world, comps.engine) if sim else None
    gate = probe if probe is not None else comps.gate
    noise = NoiseScaleLog()  # the learner's noise-scale metrics of every step (none on the sim)
    rates = RateLog(comps.evaluator)  # per-prompt rates: paired differences between policies
    orch = build_orchestrator(
        cfg,
        dataclasses.replace(comps, gate=gate, evaluator=rates),
        RunOutputs(on_step=noise),
        run_id=f"{spec.policy}-{spec.seed}",
    )
    started = time.perf_counter()
    try:
        summary = anyio.run(orch.run)
    finally:
        anyio.run(comps.engine.aclose)
    m = summary.budget.as_metrics()
    gate_metrics = gate.metrics()
    return {
        "engine": cfg.engine.kind,
        "scenario": spec.scenario,
        "model": spec.model,
        "policy": spec.policy,
        "seed": spec.seed,
        "budget": spec.budget,
        "steps": summary.steps,
        "wall_s": time.perf_counter() - started,
        "curve": [curve_point(e, sim) for e in summary.evals],
        "effective_yield": (
            m["pipeline/groups_effective"]
            / max(1.0, m["pipeline/groups_opened"] - gate_metrics.get("gate/uncounted", 0.0))
        ),
        "rollouts": m["pipeline/rollouts_started"],
        "tokens": m["pipeline/tokens_generated"],
        "false_abandonment": (probe.false_abandonment_sum / probe.abandoned_incomplete)
        if probe and probe.abandoned_incomplete
        else math.nan,
        "abandoned_incomplete": probe.abandoned_incomplete if probe else 0,
        "controller": {k: v for k, v in summary.controller_metrics.items() if math.isfinite(v)},
        "gate": {k: float(v) for k, v in gate_metrics.items() if math.isfinite(v)},  # its verdict counters
        **noise.summary(),  # noise_scale (null on the sim: no gradient), its interval, batch_rollouts
        **rates.record(),  # rates_start, rates_final: per-prompt success rates of the first and last evaluation
    }


def curve_point(e: dict[str, float], sim: bool) -> tuple[float, ...]:
    """(rollouts, tokens, seconds, accuracy, step, hardest-level accuracy) of one evaluation.

    The oracle's saturated draws are booked as uncounted (perfect foresight skips them) and
    subtracted. Seconds: engine time on the sim's clock; on a real engine the wall clock minus
    the time spent evaluating.
    """
    seconds = e["pipeline/engine_time"] if sim else e.get("pipeline/wall_s", math.nan) - e.get("eval/wall_s_total", 0.0)
    return (
        e["pipeline/rollouts_started"] - e.get("gate/uncounted_rollouts", 0.0),
        e["pipeline/tokens_generated"] - e.get("gate/uncounted_tokens", 0.0),
        seconds,
        e["eval/accuracy"],
        e["step"],
        hardest_accuracy(e),
    )


def hardest_accuracy(e: dict[str, float]) -> float:
    """``eval/accuracy_hardest`` (sim), else the accuracy of the highest ``eval/accuracy/d=K``.

    >>> hardest_accuracy({"eval/accuracy/d=1": 0.9, "eval/accuracy/d=10": 0.1, "eval/accuracy/d=2": 0.5})
    0.1
    """
    if "eval/accuracy_hardest" in e:
        return float(e["eval/accuracy_hardest"])
    from railgate.report import difficulty_levels

    levels = difficulty_levels(e)
    return float(levels[max(levels)]) if levels else math.nan


def _scenario(name: str) -> dict[str, Any]:
    from pipeline.config.build import ConfigError, load_yaml

    path = SCENARIO_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))
        raise ConfigError(f"unknown scenario {name!r}; choose from {', '.join(known)}")
    return load_yaml(path)


def is_sim_config(path: str | Path) -> bool:
    """Whether a benchmark's base config runs the simulator (``engine.kind``, default sim)."""
    from pipeline.config.build import load_yaml

    return load_yaml(path).get("engine", {}).get("kind", "sim") == "sim"


@dataclass(frozen=True)
class BenchGrid:
    """What one benchmark runs: every policy at seeds ``first_seed`` to ``first_seed + seeds - 1``,
    ``budget`` rollouts each, from ``base_config`` with the ``extra`` ``--set`` overrides; on the
    simulator each scenario and training model too (on a real model both lists are ``[""]``).

    >>> BenchGrid(Path("configs/sim.yaml"), ["easy"], ["sara"], 2, 100, ["effective"], first_seed=3).setup()
    'config configs/sim.yaml, budget 100 rollouts per run, 2 seeds (3 to 4)'
    """

    base_config: Path
    scenarios: list[str]
    policies: list[str]
    seeds: int
    budget: int
    models: list[str]
    extra: tuple[str, ...] = ()
    first_seed: int = 0

    def setup(self) -> str:
        """The report's line on what every run shares: config, overrides, budget and seeds."""
        return (
            f"config {self.base_config}"
            + (f" with {' '.join(self.extra)}" if self.extra else "")
            + f", budget {self.budget} rollouts per run, {self.seeds} seeds"
            + (f" ({self.first_seed} to {self.first_seed + self.seeds - 1})" if self.first_seed else "")
        )


def grid(bench: BenchGrid, out: Path, progress: bool = True) -> list[RunSpec]:
    """The runs of ``bench`` (a later invocation with ``first_seed`` adds seeds to an earlier
    one's). On a real model this warm-starts the shared base model first."""
    base_config, budget, extra = bench.base_config, bench.budget, bench.extra
    seed_range = range(bench.first_seed, bench.first_seed + bench.seeds)
    from railgate.bench.policies import overrides as policy_overrides

    for policy in bench.policies:
        policy_overrides(policy)  # fail fast on a typo
    if is_sim_config(base_config):
        for model in bench.models:
            if model not in MODELS:
                raise ValueError(f"unknown training model {model!r}; choose from {', '.join(MODELS)}")
        for scenario in bench.scenarios:
            _scenario(scenario)
        specs = [
            RunSpec(str(base_config), scenario, model, policy, seed, budget, extra=extra)
            for scenario in bench.scenarios
            for model in bench.models
            for seed in seed_range
            for policy in bench.policies
        ]
        specs[0].config()  # a bad --set fails here, not in a worker
        return specs
    specs = [
        RunSpec(
            str(base_config), "", "", policy, seed, budget, run_dir=str(out / "runs" / f"{policy}-s{seed}"), extra=extra
        )
        for seed in seed_range
        for policy in bench.policies
    ]
    cfg = specs[0].config()  # a bad --set fails here, before the warm start
    base_model = str(ensure_shared_base_model(cfg, out, progress))
    return [dataclasses.replace(spec, base_model=base_model) for spec in specs]


def earlier_runs(bench: BenchGrid, specs: list[RunSpec], path: Path) -> list[dict[str, Any]]:
    """The runs in ``path`` that ``specs`` do not run again, checked to share ``bench``'s budget
    and ``--set`` overrides (a run with other settings would not be comparable); none without
    the file.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "allocation.json"
    >>> grid_ = BenchGrid(Path("configs/sim.yaml"), [""], ["sara"], 1, 100, [""])
    >>> spec = RunSpec("configs/sim.yaml", "", "", "sara", 0, 100)
    >>> _ = path.write_text(json.dumps([{"policy": "uniform", "seed": 0, "scenario": "", "model": "", "budget": 100,
    ...                                  "overrides": []}, {"policy": "sara", "seed": 0, "scenario": "", "model": "",
    ...                                  "budget": 100, "overrides": []}]))
    >>> [r["policy"] for r in earlier_runs(grid_, [spec], path)]   # sara is run again: only uniform is kept
    ['uniform']
    """
    if not path.exists():
        return []
    again = {(s.policy, s.seed, s.scenario, s.model) for s in specs}
    kept = []
    for r in json.loads(path.read_text()):
        if (r["policy"], r["seed"], r["scenario"], r["model"]) in again:
            continue
        if r["budget"] != bench.budget or r.get("overrides") != list(bench.extra):
            raise ConfigError(
                f"--add: {path} holds run {r['policy']} seed {r['seed']} with budget {r['budget']} and overrides "
                f"{r.get('overrides', 'unrecorded')}, this one has budget {bench.budget} and {list(bench.extra)}; "
                "give the same --budget and --set options, or another --out"
            )
        kept.append(r)
    return kept


def run_allocation_bench(
    bench: BenchGrid,
    out: Path,
    target_gain: float,
    workers: int = 2,
    title: str = "Allocation benchmark",
    progress: bool = True,
    add: bool = False,
) -> list[dict[str, Any]]:
    """Run ``bench``'s grid into ``out`` and report it; ``add``: keep the runs of an earlier
    invocation into ``out`` (other policies or seeds, same budget and overrides) and report
    them together with this one's (``earlier_runs``)."""
    out.mkdir(parents=True, exist_ok=True)
    specs = grid(bench, out, progress=progress)
    from tqdm import tqdm

    results = earlier_runs(bench, specs, out / "allocation.json") if add else []
    started = time.perf_counter()
    # spawn, not fork: a parent that has run torch (the shared warm start) must not fork.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        for result in tqdm(pool.map(run_one, specs), total=len(specs), desc=title.lower(), disable=not progress):
            results.append({**result, "overrides": list(bench.extra)})
            (out / "allocation.json").write_text(json.dumps(results))  # a crash keeps finished runs
    text = report_text(results, target_gain, title, bench.setup(), time.perf_counter() - started)
    (out / "allocation.md").write_text(text)
    plot(results, out / "allocation.png")
    print(text)
    print(f"written: {out / 'allocation.md'}, {out / 'allocation.png'}")
    return summarise(results, target_gain)
