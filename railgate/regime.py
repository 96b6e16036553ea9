"""The training regime of a run, from the learner's gradient noise scale.

The torch learner logs per step the unbiased estimates of |G|² (``learner/grad_sq``) and
tr(Σ) (``learner/trace_sigma``) and their moving-average ratio ``learner/noise_scale``: the
simple noise scale B_simple of McCandlish et al. (2018), in rollouts (``learner.noise_scale``).

A run's noise scale is the ratio of the run means of tr(Σ) and |G|² (the paper's advice,
average numerator and denominator before dividing, applied to the whole run), with a 95%
interval from the spread of the per-step |G|² estimates, which dominates its uncertainty when
the batch is far below the noise scale. Against the rollouts trained per step (B) it says what
limits progress: well above B_simple a step's gradient is already nearly exact, so progress is
limited by the number of optimiser steps and a smaller batch (more steps from the same
rollouts) pays more than filling the batch with better groups; well below it the gradient is
mostly noise, so every informative rollout counts and skipping saturated groups pays. (The
theory assumes a learning rate tuned to the batch; at a fixed Adam learning rate fewer, larger
steps also move the weights less.) The simulator's learner has no gradient and logs none.

>>> log = NoiseScaleLog()
>>> for step, (trace, grad_sq) in enumerate([(100.0, 1.0), (300.0, 3.0)]):
...     log(step + 1, {"learner/noise_scale": 50.0, "learner/rollouts_trained": 64.0,
...                    "learner/trace_sigma": trace, "learner/grad_sq": grad_sq})
>>> s = log.summary()
>>> s["noise_scale"], s["noise_scale_step_mean"], s["batch_rollouts"]     # 200 / 2; mean of 50, 50
(100.0, 50.0, 64.0)
>>> print(regime_sentence(256.0, 32.0))
the batch (256 rollouts) is 8.0 times the noise scale (32 rollouts): progress is step-limited; smaller batches pay more than skipping saturated groups
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

STEP_LIMITED = 2.0
"""B / B_simple at or above this: step-limited; at or below 1 / STEP_LIMITED: noise-limited."""
KEYS = ("learner/noise_scale", "learner/rollouts_trained", "learner/trace_sigma", "learner/grad_sq")


class NoiseScaleLog:
    """Collects the noise-scale metrics of each step (an ``on_step(step, metrics)`` callback);
    a step logged twice (a resumed run redoes steps after its checkpoint) counts once, last wins."""

    def __init__(self) -> None:
        self._steps: dict[int, dict[str, float]] = {}

    def __call__(self, step: int, metrics: dict[str, Any]) -> None:
        values = {k: metrics.get(k) for k in KEYS}
        self._steps[int(step)] = {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}

    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]]) -> "NoiseScaleLog":
        """From ``metrics.jsonl`` records (``pipeline.metrics.read_metrics``)."""
        log = cls()
        for record in records:
            if "step" in record:
                log(int(record["step"]), record)
        return log

    @classmethod
    def from_run_dir(cls, run_dir: str | Path) -> "NoiseScaleLog":
        """From a run directory's ``metrics.jsonl`` (empty when there is none)."""
        from pipeline.metrics import read_metrics

        path = Path(run_dir) / "metrics.jsonl"
        return cls.from_records(read_metrics(path)) if path.is_file() else cls()

    def summary(self) -> dict[str, float | int | None]:
        """The run's noise scale (see the module docstring; None when the run mean of |G|² is
        not positive), its 95% interval ``noise_scale_low`` .. ``noise_scale_high`` (None:
        unbounded), ``noise_scale_step_mean`` (the mean of the logged moving-average values),
        ``noise_scale_steps`` (steps measured), ``batch_rollouts`` (mean rollouts trained per
        step) and the raw run means ``trace_sigma_mean``, ``grad_sq_mean`` with the standard
        error ``grad_sq_se``. None wherever nothing was measured."""
        measured = [m for m in self._steps.values() if "learner/trace_sigma" in m and "learner/grad_sq" in m]
        n = len(measured)
        out: dict[str, float | int | None] = dict.fromkeys(("noise_scale", "noise_scale_low", "noise_scale_high"))
        raw: dict[str, float | None] = dict.fromkeys(("trace_sigma_mean", "grad_sq_mean", "grad_sq_se"))
        if n:
            trace = sum(m["learner/trace_sigma"] for m in measured) / n
            grad_sq = sum(m["learner/grad_sq"] for m in measured) / n
            spread = math.sqrt(sum((m["learner/grad_sq"] - grad_sq) ** 2 for m in measured) / (n - 1)) if n > 1 else math.inf
            half = 2.0 * spread / math.sqrt(n)
            raw = {"trace_sigma_mean": trace, "grad_sq_mean": grad_sq, "grad_sq_se": spread / math.sqrt(n) if n > 1 else None}

            def ratio(denominator: float) -> float | None:
                return trace / denominator if denominator > 0 and trace > 0 and math.isfinite(denominator) else None

            out = {"noise_scale": ratio(grad_sq), "noise_scale_low": ratio(grad_sq + half),
                   "noise_scale_high": ratio(grad_sq - half)}
            if out["noise_scale"] is None and trace <= 0:  # no spread between micro-batches: noise scale 0
                out = dict.fromkeys(out, 0.0) if grad_sq > 0 else out
        return {
            **out,
            **raw,
            "noise_scale_step_mean": _mean(m.get("learner/noise_scale") for m in self._steps.values()),
            "noise_scale_steps": n,
            "batch_rollouts": _mean(m.get("learner/rollouts_trained") for m in self._steps.values()),
        }


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


def regime_sentence(batch: float | None, noise_scale: float | None, low: float | None = None,
                    high: float | None = None, steps: int = 0) -> str:
    """What the noise scale means for a run whose steps train ``batch`` rollouts, in words;
    with an interval (``low``, ``high``; ``high`` None: unbounded) when one is given, and
    ``steps`` the steps measured (to tell an unresolved gradient from no measurement).

    >>> print(regime_sentence(64.0, 640.0, low=320.0, high=None))
    the batch (64 rollouts) is 10.0 times below the noise scale (640 rollouts; 95% interval 320 to unbounded): progress is noise-limited; skipping saturated groups pays more than smaller batches
    """
    kind = regime(batch, noise_scale, low)
    if kind == "not measured":
        if batch and low is not None:
            return (f"the gradient is not resolved over the run: the noise scale is at least {low:.0f} rollouts "
                    f"(95% lower bound) against a batch of {batch:.0f}, too close to say which way progress is limited")
        if batch and steps:
            return (f"the gradient is not resolved over the run's {steps} measured steps (the run mean of |G|² is within "
                    f"its noise of 0): the noise scale is too far above the batch ({batch:.0f} rollouts) for the run to "
                    "bound it; more steps are needed to say which way progress is limited")
        return ("the gradient noise scale was not measured (the simulator has no gradient; the torch learner needs at "
                "least two micro-batches per step: learner.micro_batch at most half the rollouts per step)")
    assert batch is not None
    interval = ""
    if low is not None or high is not None:
        interval = f"; 95% interval {low or 0:.0f} to {'unbounded' if high is None else f'{high:.0f}'}"
    if noise_scale is not None and noise_scale <= 0:
        head = f"the micro-batches' gradients agree exactly (noise scale 0) at a batch of {batch:.0f} rollouts"
    elif noise_scale is None:  # resolved only as a lower bound
        head = (f"the gradient is not resolved over the run: the noise scale is at least {low:.0f} rollouts (95% lower "
                f"bound), {low / batch:.1f} times the batch ({batch:.0f} rollouts)")
    elif kind == "noise-limited":
        head = (f"the batch ({batch:.0f} rollouts) is {noise_scale / batch:.1f} times below the noise scale "
                f"({noise_scale:.0f} rollouts{interval})")
    else:
        head = (f"the batch ({batch:.0f} rollouts) is {batch / max(noise_scale, 1e-12):.1f} times the noise scale "
                f"({noise_scale:.0f} rollouts{interval})")
    tail = {
        "step-limited": "progress is step-limited; smaller batches pay more than skipping saturated groups",
        "noise-limited": "progress is noise-limited; skipping saturated groups pays more than smaller batches",
        "near the noise scale": "near it, steps and signal limit progress about equally; neither smaller batches nor "
                                "skipping saturated groups dominates",
    }[kind]
    ends = {regime(batch, low), regime(batch, high if high is not None else math.inf)} - {"not measured"}
    unsettled = "" if noise_scale is None or ends <= {kind} else (
        f" (the interval reaches {' and '.join(sorted(ends - {kind}))}: not settled)")
    return f"{head}: {tail}{unsettled}"
