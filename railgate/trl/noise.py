"""The gradient noise scale of a TRL trainer's optimiser steps, measured as railgate's learner does.

``learner.noise_scale`` estimates the simple noise scale B_simple (McCandlish et al. 2018) of
railgate's own learner from consecutive steps' gradients: G_t · G_(t-1) estimates |G|² and
B (|G_t|² - G_t · G_(t-1)) estimates tr(Σ), both averaged over steps before their ratio is
taken. ``NoiseScaleMeter`` does the same for a ``transformers`` trainer: ``MeasuresNoise`` is a
mixin that reads the accumulated gradient of each optimiser step *before* it is clipped (in
``_clip_grad_norm``, so the clip's per-step scale does not enter the estimate; with clipping off,
``_NoiseCallback`` reads it just before the optimiser step).

What it is for. Against the rows trained per step (B), the noise scale says what limits a run:
B well above B_simple is step-limited (a step's gradient is already nearly exact, so the number
of steps limits progress), well below it noise-limited (every informative rollout counts).
``railgate.regime.regime_sentence`` words it. Rows with zero advantage (an all-same group's)
carry no gradient; they scale |G|² by the share s of informative rows squared and tr(Σ) by s,
so B / B_simple is the same whether a step is padded with them or not, and B_simple times s is
the noise scale of the informative rows alone: ``noise_groups`` (in mixed groups of
``group_size``) is what SARA's probing rule prices optimiser steps with
(``controller.probing.step_value``).

>>> import torch
>>> w = torch.nn.Parameter(torch.zeros(2))
>>> meter = NoiseScaleMeter(decay=0.0)
>>> w.grad = torch.tensor([1.0, 1.0]); meter.measure(1, [w], rows=64)       # the first step: kept only
>>> w.grad = torch.tensor([2.0, 0.0]); meter.measure(2, [w], rows=64)       # |G|² = 2, tr(Σ) = 64 x (4 - 2)
>>> meter.measure(2, [w], rows=64)                                          # the same step again: ignored
>>> meter.value, meter.noise_groups(group_size=8, informative_share=0.5)    # 128 / 2 = 64 rows; 64 * 0.5 / 8
(64.0, 4.0)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from learner.noise_scale import NoiseScaleEMA, PreviousStepGradient, consecutive_estimate

NOISE_DECAY = 0.9
"""Per-step decay of the averages of |G|² and tr(Σ): about the last 10 steps. Shorter than the
own learner's 0.99 because TRL runs here are tens of steps, not hundreds; both averages start at
0 and the ratio cancels that start."""


class NoiseScaleMeter:
    """The simple gradient noise scale of a run's optimiser steps, in rows; see the module docstring."""

    def __init__(self, decay: float = NOISE_DECAY):
        self.ema = NoiseScaleEMA(decay)
        self.previous = PreviousStepGradient()
        self.rows = 0.0  # rows trained in the latest measured step
        self.last: tuple[float, float] | None = None  # the latest step's (tr(Σ), |G|²) estimates
        self._measured = -1  # the latest measured step

    def measure(self, step: int, params: Iterable[torch.Tensor], rows: float) -> None:
        """Fold in optimiser step ``step``'s accumulated gradient of ``rows`` trained rows (once a step)."""
        if step == self._measured:
            return
        self._measured = step
        grads = [p for p in params if p.requires_grad]
        big_sq = sum(float(p.grad.detach().float().pow(2).sum()) for p in grads if p.grad is not None)
        dot = self.previous.dot_and_keep(grads)
        self.rows = float(rows)
        if dot is not None:
            est = consecutive_estimate(big_sq, dot, rows)
            self.last = (est.trace, est.grad_sq)
            self.ema.update(est)

    @property
    def value(self) -> float:
        """B_simple in rows (NaN until two steps were measured and |G|² is resolved)."""
        return self.ema.value

    def noise_groups(self, group_size: int, informative_share: float) -> float:
        """The noise scale of the informative rows, in groups of ``group_size``: ``value x share / G``
        (``informative_share``: the share of trained rows in mixed groups). NaN while unknown."""
        return self.value * informative_share / group_size

    def metrics(self, prefix: str = "railgate") -> dict[str, float]:
        """``<prefix>/noise_scale`` (rows; the moving average) and ``<prefix>/batch_over_noise``
        (rows per step / it) once resolved, and the latest step's own estimates
        ``<prefix>/trace_sigma`` and ``<prefix>/grad_dot_prev`` with ``<prefix>/rows_trained``, from
        which a whole run's noise scale and its interval follow (``railgate.regime``)."""
        out: dict[str, float] = {}
        if self.last is not None:
            out.update(
                {
                    f"{prefix}/trace_sigma": self.last[0],
                    f"{prefix}/grad_dot_prev": self.last[1],
                    f"{prefix}/rows_trained": self.rows,
                }
            )
        if math.isfinite(self.value) and self.value > 0:
            out.update({f"{prefix}/noise_scale": self.value, f"{prefix}/batch_over_noise": self.rows / self.value})
        return out


def step_rows(args: Any, world_size: int) -> int:
    """Rows one optimiser step trains: per-device batch x accumulation steps x processes."""
    return int(args.per_device_train_batch_size * args.gradient_accumulation_steps * world_size)


class MeasuresNoise:
    """Mixin for a ``transformers.Trainer``: measures each optimiser step's gradient noise
    (``self.noise``, a ``NoiseScaleMeter``) before clipping, and logs ``railgate/noise_scale`` and
    ``railgate/batch_over_noise`` with the step's other metrics. Put it first among the bases:
    ``class T(MeasuresNoise, GRPOTrainer)``."""

    noise: NoiseScaleMeter

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.noise = NoiseScaleMeter()
        self.add_callback(_NoiseCallback(self))  # type: ignore[attr-defined]

    def _measure_noise(self, model: Any) -> None:
        rows = step_rows(self.args, self.accelerator.num_processes)  # type: ignore[attr-defined]
        self.noise.measure(int(self.state.global_step), model.parameters(), rows)  # type: ignore[attr-defined]

    def _clip_grad_norm(self, model: Any) -> Any:
        self._measure_noise(model)  # before the clip rescales this step's gradient
        return super()._clip_grad_norm(model)  # type: ignore[misc]

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "grad_norm" in logs:  # a training step's log
            logs.update(self.noise.metrics())
        super().log(logs, start_time)  # type: ignore[misc]


class _NoiseCallback(TrainerCallback):
    """Measures the step's gradient where clipping is off (``max_grad_norm=0``), which skips
    ``_clip_grad_norm``; where it is on, the step was already measured and this does nothing."""

    def __init__(self, trainer: MeasuresNoise):
        self.trainer = trainer

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.trainer._measure_noise(self.trainer.model)  # type: ignore[attr-defined]
        return control


class MeasuredGRPOTrainer(MeasuresNoise, GRPOTrainer):
    """TRL's ``GRPOTrainer``, unchanged, that also logs its steps' gradient noise scale as
    ``GatedGRPOTrainer`` does (``railgate/noise_scale``, ``railgate/batch_over_noise``): the
    regime a plain GRPO run is in, read before deciding whether gating will pay. The measurement
    reads the gradients and changes no update; it keeps one copy of the gradient."""
