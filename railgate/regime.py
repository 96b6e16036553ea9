"""The training regime of a run, from the learner's gradient noise scale.

The torch learner logs per step the simple noise scale B_simple of McCandlish et al. (2018),
in rollouts (``learner.noise_scale``): from consecutive steps' gradients, |G|² as
``learner/grad_dot_prev`` = G_t · G_(t-1) and tr(Σ) as ``learner/trace_sigma`` =
B (|G_t|² - G_t · G_(t-1)), their moving-average ratio ``learner/noise_scale``; and the same
from the step's micro-batches (``learner/grad_sq_micro``, ``learner/trace_sigma_micro``,
``learner/noise_scale_micro``), a diagnostic that is biased far below the noise scale.

A run's noise scale is the ratio of the run means of tr(Σ) and |G|² (the paper's advice,
average numerator and denominator before dividing, applied to the whole run), with Fieller's
95% interval for a ratio of means from the per-step estimates; far below the noise scale the
uncertainty of |G|² dominates and the interval is unbounded above.

Against the rollouts trained per step (B) the noise scale says what limits progress: well
above B_simple a step's gradient is already nearly exact, so progress is limited by the number
of optimiser steps and a smaller batch (more steps from the same rollouts) pays more than
filling the batch with better groups; well below it the gradient is mostly noise, so every
informative rollout counts and skipping saturated groups pays. (The theory assumes a learning
rate tuned to the batch; at a fixed Adam learning rate fewer, larger steps also move the
weights less.) The simulator's learner has no gradient and logs none.

>>> log = NoiseScaleLog()
>>> for step, (trace, grad_sq) in enumerate([(100.0, 1.0), (300.0, 3.0)]):
...     log(step + 1, {"learner/noise_scale": 50.0, "learner/rollouts_trained": 64.0,
...                    "learner/trace_sigma": trace, "learner/grad_dot_prev": grad_sq})
>>> s = log.summary()
>>> s["noise_scale"], s["noise_scale_step_mean"], s["batch_rollouts"]     # 200 / 2; mean of 50, 50
(100.0, 50.0, 64.0)
>>> print(regime_sentence(256.0, 32.0))
the batch (256 rollouts) is 8.0 times the noise scale (32 rollouts): progress is step-limited; smaller batches pay more than skipping saturated groups
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

STEP_LIMITED = 2.0
"""B / B_simple at or above this: step-limited; at or below 1 / STEP_LIMITED: noise-limited."""
KEYS = (
    "learner/rollouts_trained",
    "learner/noise_scale",
    "learner/trace_sigma",
    "learner/grad_dot_prev",
    "learner/noise_scale_micro",
    "learner/trace_sigma_micro",
    "learner/grad_sq_micro",
)
ESTIMATES = {
    "noise_scale": ("learner/trace_sigma", "learner/grad_dot_prev"),
    "noise_scale_micro": ("learner/trace_sigma_micro", "learner/grad_sq_micro"),
}
"""Run-summary prefix: the per-step metrics of tr(Σ) and |G|² it is the ratio of."""


class NoiseScaleLog:
    """Collects the noise-scale metrics of each step (an ``on_step(step, metrics)`` callback);
    a step logged twice (a resumed run redoes steps after its checkpoint) counts once, last wins."""

    def __init__(self) -> None:
        self._steps: dict[int, dict[str, float]] = {}

    def __call__(self, step: int, metrics: dict[str, Any]) -> None:
        values = {k: metrics.get(k) for k in KEYS}
        self._steps[int(step)] = {
            k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)
        }

    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]]) -> NoiseScaleLog:
        """From ``metrics.jsonl`` records (``pipeline.metrics.read_metrics``)."""
        log = cls()
        for record in records:
            if "step" in record:
                log(int(record["step"]), record)
        return log

    @classmethod
    def from_run_dir(cls, run_dir: str | Path) -> NoiseScaleLog:
        """From a run directory's ``metrics.jsonl`` (empty when there is none)."""
        from pipeline.metrics import read_metrics

        path = Path(run_dir) / "metrics.jsonl"
        return cls.from_records(read_metrics(path)) if path.is_file() else cls()

    def summary(self) -> dict[str, float | int | None]:
        """Per estimate (``noise_scale``: consecutive steps; ``noise_scale_micro``: micro-batches)
        the run's noise scale (None when the run mean of |G|² is not positive), its 95% interval
        ``_low`` .. ``_high`` (None: unbounded), ``_steps`` (steps measured), ``_step_mean`` (the
        mean of the logged moving-average values) and the raw run means ``_trace`` and
        ``_grad_sq`` with the standard error ``_grad_sq_se``; and ``batch_rollouts``, the mean
        rollouts trained per step. None wherever nothing was measured."""
        steps = list(self._steps.values())
        out: dict[str, float | int | None] = {}
        for prefix, (trace_key, grad_key) in ESTIMATES.items():
            measured = [m for m in steps if trace_key in m and grad_key in m]
            r = _ratio([m[trace_key] for m in measured], [m[grad_key] for m in measured])
            out.update(
                {
                    prefix: r["point"],
                    f"{prefix}_low": r["low"],
                    f"{prefix}_high": r["high"],
                    f"{prefix}_steps": len(measured),
                    f"{prefix}_step_mean": _mean(m.get(f"learner/{prefix}") for m in steps),
                    f"{prefix}_trace": r["trace"],
                    f"{prefix}_grad_sq": r["grad_sq"],
                    f"{prefix}_grad_sq_se": r["se"],
                }
            )
        out["batch_rollouts"] = _mean(m.get("learner/rollouts_trained") for m in steps)
        return out


def _ratio(traces: list[float], grad_sqs: list[float]) -> dict[str, float | None]:
    """Run mean of tr(Σ) over run mean of |G|² with Fieller's 95% interval for a ratio of means
    (from the per-step estimates' variances and covariance). Far below the noise scale the mean
    of |G|² is not clear of 0 and the interval is unbounded above (``high`` None) or, if even
    its lower end is unresolved, absent (``low`` None). A run whose micro-batches never differ
    (tr(Σ) = 0) has noise scale 0."""
    out: dict[str, float | None] = dict.fromkeys(("point", "low", "high", "trace", "grad_sq", "se"))
    n = len(grad_sqs)
    if not n:
        return out
    t, g = sum(traces) / n, sum(grad_sqs) / n
    out.update(trace=t, grad_sq=g, point=t / g if g > 0 and t > 0 else None)
    if t <= 0 < g:
        return {**out, "point": 0.0, "low": 0.0, "high": 0.0}
    if n < 2:
        return out
    var_t = sum((x - t) ** 2 for x in traces) / (n - 1) / n
    var_g = sum((x - g) ** 2 for x in grad_sqs) / (n - 1) / n
    cov = sum((x - t) * (y - g) for x, y in zip(traces, grad_sqs)) / (n - 1) / n
    out["se"] = math.sqrt(var_g)
    # R is in the set where (t - R g)² <= z² Var(t - R g): a R² + b R + c <= 0
    z2 = 4.0
    a, b, c = g * g - z2 * var_g, -2.0 * (t * g - z2 * cov), t * t - z2 * var_t
    disc = b * b - 4 * a * c
    if a > 0:  # |G|² clear of 0: a bounded interval (none when it is clearly below 0: a biased estimate)
        if g <= 0:
            return out
        root = math.sqrt(max(disc, 0.0))
        return {**out, "low": max((-b - root) / (2 * a), 0.0), "high": (-b + root) / (2 * a)}
    if disc <= 0:
        return out  # the whole line: nothing resolved
    # a <= 0: the set lies outside the roots, unbounded above; its lower end is the larger root
    r2 = max((-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)) if a else -c / b
    return {**out, "low": r2 if r2 > 0 else None}


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def regime(batch: float | None, noise_scale: float | None, low: float | None = None) -> str:
    """``step-limited``, ``noise-limited``, ``near the noise scale`` or ``not measured``.
    Without a point estimate (|G|² not resolved) a lower bound ``low`` far above the batch
    still says noise-limited.

    >>> regime(64, 640), regime(64, 50), regime(64, None), regime(64, None, low=500)
    ('noise-limited', 'near the noise scale', 'not measured', 'noise-limited')
    """
    if not batch:
        return "not measured"
    if noise_scale is None or not math.isfinite(noise_scale):
        return "noise-limited" if low is not None and low >= STEP_LIMITED * batch else "not measured"
    if noise_scale <= 0 or batch / noise_scale >= STEP_LIMITED:
        return "step-limited"
    if batch / noise_scale <= 1 / STEP_LIMITED:
        return "noise-limited"
    return "near the noise scale"


def regime_sentence(
    batch: float | None,
    noise_scale: float | None,
    low: float | None = None,
    high: float | None = None,
    steps: int = 0,
    unit: str = "rollouts",
) -> str:
    """What the noise scale means for a run whose steps train ``batch`` rollouts, in words;
    with an interval (``low``, ``high``; ``high`` None: unbounded) when one is given, and
    ``steps`` the steps measured (to tell an unresolved gradient from no measurement);
    ``unit`` names what batch and noise scale count (a TRL trainer's ``rows``).

    >>> print(regime_sentence(64.0, 640.0, low=320.0, high=None))
    the noise scale (640 rollouts; 95% interval 320 to unbounded) is 10.0 times the batch (64 rollouts): progress is noise-limited; skipping saturated groups pays more than smaller batches (at a learning rate tuned to the batch size; at a fixed one, smaller batches also take more steps of the same size)
    """
    kind = regime(batch, noise_scale, low)
    if kind == "not measured":
        if batch and low is not None:
            return (
                f"the gradient is not resolved over the run: the noise scale is at least {low:.0f} {unit} "
                f"(95% lower bound) against a batch of {batch:.0f}, too close to say which way progress is limited"
            )
        if batch and steps:
            return (
                f"the gradient is not resolved over the run's {steps} measured steps (the run mean of |G|² is within "
                f"its noise of 0): the noise scale is too far above the batch ({batch:.0f} {unit}) for the run to "
                "bound it; more steps are needed to say which way progress is limited"
            )
        return (
            "the gradient noise scale was not measured (the simulator has no gradient; on a real model it needs "
            "learner.noise_scale on and at least two steps)"
        )
    assert batch is not None
    interval = ""
    if low is not None or high is not None:
        interval = f"; 95% interval {low or 0:.0f} to {'unbounded' if high is None else f'{high:.0f}'}"
    if noise_scale is not None and noise_scale <= 0:
        head = f"the micro-batches' gradients agree exactly (noise scale 0) at a batch of {batch:.0f} {unit}"
    elif noise_scale is None:  # resolved only as a lower bound
        head = (
            f"the gradient is not resolved over the run: the noise scale is at least {low:.0f} {unit} (95% lower "
            f"bound), {low / batch:.1f} times the batch ({batch:.0f} {unit})"
        )
    elif kind == "noise-limited":
        head = (
            f"the noise scale ({noise_scale:.0f} {unit}{interval}) is {noise_scale / batch:.1f} times the batch "
            f"({batch:.0f} {unit})"
        )
    else:
        head = (
            f"the batch ({batch:.0f} {unit}) is {batch / max(noise_scale, 1e-12):.1f} times the noise scale "
            f"({noise_scale:.0f} {unit}{interval})"
        )
    tail = {
        "step-limited": "progress is step-limited; smaller batches pay more than skipping saturated groups",
        "noise-limited": "progress is noise-limited; skipping saturated groups pays more than smaller batches "
        "(at a learning rate tuned to the batch size; at a fixed one, smaller batches also take "
        "more steps of the same size)",
        "near the noise scale": "near it, steps and signal limit progress about equally; neither smaller batches nor "
        "skipping saturated groups dominates",
    }[kind]
    ends = {regime(batch, low), regime(batch, high if high is not None else math.inf)} - {"not measured"}
    unsettled = (
        ""
        if noise_scale is None or ends <= {kind}
        else (f" (the interval reaches {' and '.join(sorted(ends - {kind}))}: not settled)")
    )
    return f"{head}: {tail}{unsettled}"


def combine(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' summaries (seeds of one setting) as one: mean points when every run has one,
    the widest interval, the fewest steps, the mean batch.

    >>> combine([{"noise_scale": 100.0, "noise_scale_low": 50.0, "noise_scale_high": 300.0},
    ...          {"noise_scale": 200.0, "noise_scale_low": 80.0, "noise_scale_high": None}])["noise_scale_high"] is None
    True
    """
    out: dict[str, Any] = {}
    for prefix in ESTIMATES:
        points = [r.get(prefix) for r in summaries]
        lows = [r.get(f"{prefix}_low") for r in summaries]
        highs = [r.get(f"{prefix}_high") for r in summaries]
        out[prefix] = sum(points) / len(points) if points and all(p is not None for p in points) else None
        out[f"{prefix}_low"] = min((v for v in lows if v is not None), default=None)
        out[f"{prefix}_high"] = max(highs) if highs and all(v is not None for v in highs) else None
        out[f"{prefix}_steps"] = min((int(r.get(f"{prefix}_steps") or 0) for r in summaries), default=0)
    out["batch_rollouts"] = _mean(r.get("batch_rollouts") for r in summaries)
    return out


def regime_text(summary: dict[str, Any]) -> str:
    """A run's (or ``combine``d runs') noise scale in words: what the consecutive-step estimate
    says, then the micro-batch figure beside it.

    >>> print(regime_text({"batch_rollouts": 64.0, "noise_scale": 800.0, "noise_scale_low": 400.0,
    ...     "noise_scale_high": 5000.0, "noise_scale_steps": 300, "noise_scale_micro_steps": 0}))
    The noise scale (800 rollouts; 95% interval 400 to 5000) is 12.5 times the batch (64 rollouts): progress is noise-limited; skipping saturated groups pays more than smaller batches (at a learning rate tuned to the batch size; at a fixed one, smaller batches also take more steps of the same size).
    """
    batch = summary.get("batch_rollouts")
    main = regime_sentence(
        batch,
        summary.get("noise_scale"),
        summary.get("noise_scale_low"),
        summary.get("noise_scale_high"),
        steps=int(summary.get("noise_scale_steps") or 0),
    )
    text = f"{main[:1].upper()}{main[1:]}."
    if summary.get("noise_scale_micro_steps"):
        point, low, high = (summary.get(f"noise_scale_micro{s}") for s in ("", "_low", "_high"))
        figure = f"{point:.0f} rollouts" if point is not None else "not resolved"
        if low is not None:
            figure += f" (95% interval {low:.0f} to {'unbounded' if high is None else f'{high:.0f}'})"
        text += (
            f" The micro-batch estimate (within each step; biased when the batch is far below the noise scale): "
            f"{figure}."
        )
    return text
