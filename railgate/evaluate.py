"""``python run.py eval``: held-out accuracy of a policy, alone or paired against another.

A policy is a run directory (its newest checkpoint, or with ``--base`` its base policy) or a
model directory (a Hugging Face directory: an export, a ``warm-start`` output, a run's
``base_model``). ``eval A`` reports A's accuracy with its 95% interval over prompts;
``eval A --against B`` evaluates both on the same held-out prompts with the same random draws
(the engines key them by seed, prompt and sample: ``pipeline.evaluation``) and reports the
paired difference A - B with its 95% interval over prompts (``pipeline.intervals``). A against
itself gives exactly 0 with the interval [0, 0].

The evaluation's settings (task, held-out prompts, samples per prompt, temperature, seed,
engine) are A's run config, else B's, else ``--config`` (default ``configs/default.yaml``),
with ``--set`` applied; each side keeps only its own model (and learner) settings.

>>> Policy(Path("runs/x"), base=True).label()
'runs/x (base)'
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from pipeline.intervals import paired_difference, prompt_mean
from pipeline.store.atomic import atomic_write
from railgate.build import build_components
from railgate.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from railgate.config import RunConfig, load_config
from railgate.report import accuracy_text, markdown_table
from railgate.rundir import check_writable, refuse_links
from railgate.trust import run_dir_config

RUN_CONFIG = "config.yaml"


@dataclass(frozen=True)
class Policy:
    """One side of an evaluation: a run directory (``base``: its base policy, not its newest
    checkpoint) or a model directory."""

    path: Path
    base: bool = False

    @property
    def is_run(self) -> bool:
        return (self.path / RUN_CONFIG).is_file()

    def label(self) -> str:
        return f"{self.path} (base)" if self.base else str(self.path)

    def check(self) -> None:
        """A clear error for a path that is neither a run directory nor a model directory."""
        from pipeline.config.build import ConfigError

        if self.is_run:
            return
        if not self.path.is_dir():
            raise ConfigError(
                f"eval {self.path}: the directory does not exist; pass a train run's run_dir or a "
                "Hugging Face model directory"
            )
        if not (self.path / "config.json").is_file():
            raise ConfigError(
                f"eval {self.path}: neither a run directory ({RUN_CONFIG}) nor a model directory "
                "(config.json); pass a train run's run_dir or a Hugging Face model directory"
            )
        if self.base:
            raise ConfigError(
                f"eval {self.path} --base: --base picks a run directory's base policy; {self.path} is a "
                "model directory, which is evaluated as it is: drop --base"
            )


@dataclass(frozen=True)
class Evaluation:
    """A policy's held-out metrics, its per-prompt success rates and the step it was taken at."""

    metrics: dict[str, float]
    rates: tuple[float, ...]
    step: int


def settings(
    a: Policy, b: Policy | None, config: Path | None, overrides: Sequence[str], samples: int | None = None
) -> RunConfig:
    """The evaluation's settings: A's run config, else B's, else ``config``, with ``overrides``."""
    from configs import DEFAULT_CONFIG

    run = next((p for p in (a, b) if p is not None and p.is_run), None)
    extra = list(overrides) + ([f"data.eval_samples={samples}"] if samples is not None else [])
    if run is not None:  # a run directory is data: its settings that run code need --set
        return run_dir_config(run.path, extra + [f"run_dir={run.path}"], f"railgate eval {run.path}")
    return load_config(config or DEFAULT_CONFIG, extra)


def evaluate_policy(cfg: RunConfig, policy: Policy, overrides: Sequence[str] = ()) -> Evaluation:
    """Evaluate ``policy`` under the evaluation settings ``cfg`` (its own model settings kept)."""
    policy.check()
    with tempfile.TemporaryDirectory(prefix="railgate-eval-") as scratch:
        if policy.is_run:
            own = run_dir_config(
                policy.path, list(overrides) + [f"run_dir={policy.path}"], f"railgate eval {policy.path}"
            )
            side = dataclasses.replace(cfg, model=own.model, learner=own.learner, run_dir=str(policy.path))
        else:  # a model directory is loaded as it is: no warm start, nothing written beside it
            side = dataclasses.replace(
                cfg, model=dataclasses.replace(cfg.model, path=str(policy.path)), run_dir=scratch
            )
        return _evaluate(side, policy)


def _evaluate(cfg: RunConfig, policy: Policy) -> Evaluation:
    checkpoint = latest_checkpoint(cfg.run_dir) if policy.is_run and not policy.base else None
    state = None if checkpoint is None else load_checkpoint(checkpoint)  # checked before anything is built
    components = build_components(cfg, progress=False)
    components.evaluator.check_rewards = True  # an evaluation whose every reward failed says so, whatever the run set
    step = 0
    try:
        if state is not None:
            try:
                components.learner.load_state_dict(state["learner"])
            except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
                raise CheckpointError(
                    f"checkpoint {checkpoint} does not fit this run's model ({type(exc).__name__}: "
                    f"{str(exc)[:160]}); evaluate with the config the run was trained with"
                ) from None
            anyio.run(components.engine.update_weights, components.learner.weights())
            step = int(state["step"])
        metrics = anyio.run(components.evaluator.evaluate, step)
    finally:
        anyio.run(components.engine.aclose)
    return Evaluation(metrics, tuple(getattr(components.evaluator, "last_rates", ())), step)


def compare(cfg: RunConfig, a: Policy, b: Policy, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """A and B on the same prompts and draws: their accuracies and the paired difference A - B
    with its 95% interval over prompts (the keys ``--json`` prints)."""
    ea, eb = evaluate_policy(cfg, a, overrides), evaluate_policy(cfg, b, overrides)
    if len(ea.rates) != len(eb.rates):  # the same settings build the same prompts; this is a guard
        raise RuntimeError(f"the two evaluations scored {len(ea.rates)} and {len(eb.rates)} prompts")
    d = paired_difference(ea.rates, eb.rates)
    return {
        "accuracy_a": prompt_mean(ea.rates).mean,
        "accuracy_b": prompt_mean(eb.rates).mean,
        "difference": d.mean,
        "difference_lo": d.lo,
        "difference_hi": d.hi,
        "prompts": d.n,
        "samples": cfg.data.eval_samples,
    }


def comparison_table(a: Policy, b: Policy, result: dict[str, Any]) -> str:
    """The comparison as markdown, for people.

    >>> r = {"accuracy_a": 0.5, "accuracy_b": 0.4, "difference": 0.1, "difference_lo": 0.05,
    ...      "difference_hi": 0.15, "prompts": 512, "samples": 4}
    >>> print(comparison_table(Policy(Path("a")), Policy(Path("b")), r).splitlines()[-1])
    | A - B (paired, same draws) | 0.100 (95% 0.050 to 0.150) |
    """
    rows = [
        ["A: " + a.label(), f"{result['accuracy_a']:.3f}"],
        ["B: " + b.label(), f"{result['accuracy_b']:.3f}"],
        ["prompts x samples", f"{result['prompts']} x {result['samples']}"],
        [
            "A - B (paired, same draws)",
            f"{result['difference']:.3f} (95% {result['difference_lo']:.3f} to {result['difference_hi']:.3f})",
        ],
    ]
    return markdown_table(["held-out accuracy", "value"], rows)


def run_eval(
    a: Policy, b: Policy | None, config: Path | None, overrides: Sequence[str], samples: int | None, as_json: bool
) -> dict[str, Any]:
    """What ``railgate eval`` does: evaluate (and compare), print, and for a run directory
    evaluated alone write ``eval_base.json`` or ``eval_stepN.json`` into it."""
    a.check()
    if b is not None:
        b.check()
    cfg = settings(a, b, config, overrides, samples)
    if b is not None:
        result = compare(cfg, a, b, overrides)
        print(json.dumps(_finite(result)) if as_json else comparison_table(a, b, result))
        return result
    if a.is_run:
        check_writable(a.path)  # the result goes there: fail now, not after the evaluation
        refuse_links(a.path)  # nor through a link a shared run directory holds
    evaluation = evaluate_policy(cfg, a, overrides)
    result = {"step": float(evaluation.step), **evaluation.metrics}
    if as_json:
        print(json.dumps(_finite(result)))
    else:
        print(markdown_table(["metric", "value"], [[k, v] for k, v in result.items()]))
        print(
            f"held-out accuracy: {accuracy_text(result)} over {sum(math.isfinite(r) for r in evaluation.rates)} prompts"
        )
    if a.is_run:
        out = a.path / ("eval_base.json" if a.base else f"eval_step{evaluation.step}.json")
        atomic_write(out, json.dumps(_finite(result), indent=2))
        if not as_json:
            print(f"written: {out}")
    return result


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN: null in its place."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
