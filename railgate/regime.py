"""The training regime of a run, from the learner's gradient noise scale.

The torch learner logs ``learner/noise_scale`` every step: the simple noise scale B_simple of
McCandlish et al. (2018), in rollouts (``learner.noise_scale``). Against the rollouts trained
per step (B) it says what limits progress: well above B_simple a step's gradient is already
nearly exact, so progress is limited by the number of optimiser steps and a smaller batch
(more steps from the same rollouts) pays more than filling the batch with better groups; well
below it the gradient is mostly noise, so every informative rollout counts and skipping
saturated groups pays. The simulator's learner has no gradient and logs no noise scale.

>>> log = NoiseScaleLog()
>>> for step, scale in enumerate([100.0, 300.0]):
...     log(step + 1, {"learner/noise_scale": scale, "learner/rollouts_trained": 64.0,
...                    "learner/trace_sigma": scale, "learner/grad_sq": 1.0})
>>> log.summary()["noise_scale"], log.summary()["batch_rollouts"]
(200.0, 64.0)
>>> print(regime_sentence(256.0, 32.0))
the batch (256 rollouts) is 8.0 times the noise scale (32 rollouts): progress is step-limited; smaller batches pay more than skipping saturated groups
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

STEP_LIMITED = 2.0
"""B / B_simple above this: step-limited; below 1 / STEP_LIMITED: noise-limited; between: near."""


class NoiseScaleLog:
    """Collects the noise-scale metrics of each step (an ``on_step(step, metrics)`` callback);
    a step logged twice (a resumed run redoes steps after its checkpoint) counts once, last wins."""

    def __init__(self) -> None:
        self._steps: dict[int, dict[str, float]] = {}

    def __call__(self, step: int, metrics: dict[str, Any]) -> None:
        keep = {k: metrics.get(k) for k in ("learner/noise_scale", "learner/rollouts_trained", "learner/trace_sigma",
                                            "learner/grad_sq")}
        self._steps[int(step)] = {k: float(v) for k, v in keep.items() if isinstance(v, (int, float))}

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

    def summary(self) -> dict[str, float | None]:
        """``noise_scale``: mean of ``learner/noise_scale`` over the steps that have it (None if
        none); ``noise_scale_pooled``: mean tr(Σ) / mean |G|² over the run (the ratio of run
        means, less noisy than the mean of per-step ratios); ``noise_scale_steps``: steps with a
        value; ``batch_rollouts``: mean rollouts trained per step."""
        def mean(key: str) -> float | None:
            values = [m[key] for m in self._steps.values() if key in m and math.isfinite(m[key])]
            return sum(values) / len(values) if values else None

        trace, grad_sq = mean("learner/trace_sigma"), mean("learner/grad_sq")
        return {
            "noise_scale": mean("learner/noise_scale"),
            "noise_scale_pooled": trace / grad_sq if trace is not None and grad_sq is not None and grad_sq > 0 else None,
            "noise_scale_steps": sum(1 for m in self._steps.values() if math.isfinite(m.get("learner/noise_scale", math.nan))),
            "batch_rollouts": mean("learner/rollouts_trained"),
        }


def regime(batch: float | None, noise_scale: float | None) -> str:
    """``step-limited``, ``noise-limited``, ``near the noise scale`` or ``not measured``.

    >>> regime(64, 640), regime(64, 50), regime(64, None)
    ('noise-limited', 'near the noise scale', 'not measured')
    """
    if not batch or noise_scale is None or not math.isfinite(noise_scale) or noise_scale <= 0:
        return "not measured"
    ratio = batch / noise_scale
    if ratio >= STEP_LIMITED:
        return "step-limited"
    if ratio <= 1 / STEP_LIMITED:
        return "noise-limited"
    return "near the noise scale"


def regime_sentence(batch: float | None, noise_scale: float | None) -> str:
    """What the noise scale means for a run whose steps train ``batch`` rollouts, in words.

    >>> print(regime_sentence(64.0, 640.0))
    the batch (64 rollouts) is 10.0 times below the noise scale (640 rollouts): progress is noise-limited; skipping saturated groups pays more than smaller batches
    """
    kind = regime(batch, noise_scale)
    if kind == "not measured":
        return ("the gradient noise scale was not measured (the simulator has no gradient; the torch learner needs at "
                "least two micro-batches per step: learner.micro_batch at most half the rollouts per step)")
    assert batch is not None and noise_scale is not None
    sizes = f"(batch {batch:.0f} rollouts, noise scale {noise_scale:.0f})"
    if kind == "step-limited":
        return (f"the batch ({batch:.0f} rollouts) is {batch / noise_scale:.1f} times the noise scale ({noise_scale:.0f} "
                "rollouts): progress is step-limited; smaller batches pay more than skipping saturated groups")
    if kind == "noise-limited":
        return (f"the batch ({batch:.0f} rollouts) is {noise_scale / batch:.1f} times below the noise scale "
                f"({noise_scale:.0f} rollouts): progress is noise-limited; skipping saturated groups pays more than "
                "smaller batches")
    return (f"the batch is {batch / noise_scale:.1f} times the noise scale {sizes}: near it, steps and signal limit "
            "progress about equally; neither smaller batches nor skipping saturated groups dominates")
