"""The simple gradient noise scale of a learner step, measured online at no extra pass.

McCandlish et al. (2018, "An Empirical Model of Large-Batch Training", appendix A) estimate
the *simple noise scale* B_simple = tr(Σ) / |G|² -- Σ the covariance of one example's
gradient, G the true (expected) gradient -- from the squared norms of two gradient estimates
of the same step taken at batch sizes B_small < B_big. Since E|G_B|² = |G|² + tr(Σ) / B::

    |G|²  = (B_big |G_big|² - B_small |G_small|²) / (B_big - B_small)
    tr(Σ) = (|G_small|² - |G_big|²) / (1 / B_small - 1 / B_big)

both unbiased. Their ratio is not (a ratio of noisy estimates is biased), so, as the paper
recommends, each is averaged over steps with an exponential moving average (EMA) and only the
averages are divided. The EMAs start at zero with the same weights, so the usual start-up
correction 1 / (1 - decay^t) cancels in the ratio.

**Units.** B counts *rollouts* (sequences): B_simple is the batch size, in rollouts, at which
the gradient's noise equals its signal. A batch well above it is step-limited (more rollouts
per step barely help, more steps would); one well below it is noise-limited (every rollout
that carries signal counts). With GRPO's saturated groups left in the loss at advantage 0
(``learner.mask_saturated: false``) they count as rollouts with a zero gradient, so the ratio
of the batch to the noise scale stays that of its informative rollouts to the noise scale
measured on informative rollouts alone.

**Two estimates in the learner** (``learner.torch_learner``), neither with an extra forward or
backward pass, both leaving the update bit-identical:

* *Consecutive steps* (``consecutive_estimate``; ``learner/noise_scale``): the batches of two
  steps are independent draws, so with B the step's rollouts, G_t its gradient and
  G_(t-1) the previous step's (``PreviousStepGradient`` keeps one copy)::

      |G|²  = G_t · G_(t-1)                 tr(Σ) = B (|G_t|² - G_t · G_(t-1))

  unbiased up to how far the true gradient moves in one small optimiser step, and with no model
  of the noise inside a step. This is the learner's noise scale.
* *Micro-batches* (``MicroBatchGradients``, ``partition_estimate``; ``learner/noise_scale_micro``):
  the paper's two batch sizes within one step, the small ones the step's micro-batches (each one's
  own gradient is read off between two backward passes: the gradient accumulated so far is set
  aside and added back, the same floating-point addition autograd makes). With K >= 2
  micro-batches whose share of the loss normaliser is f_k (tokens for a token-mean loss,
  rollouts for the sequence means), G_k each one's gradient rescaled to its own normaliser,
  G_big = Σ f_k G_k, and effective sizes b_k = f_k B rollouts::

      tr(Σ) = (Σ f_k |G_k|² - |G_big|²) / Σ f_k (1 - f_k) / b_k     (= B (Σ f_k |G_k|² - |G_big|²) / (K - 1))
      |G|²  = |G_big|² - tr(Σ) Σ f_k² / b_k                          (= |G_big|² - tr(Σ) / B)

  unbiased when the micro-batches are independent draws (two equal halves: the two-batch
  formula with B_small = B_big / 2). They are not quite: they follow the packing order
  (prompts with the longest answers first), a group's rollouts share a prompt and a centred
  advantage, and rollouts of different lengths weigh differently. Far below the noise scale
  |G|² is a small difference of two large numbers, so that shows: on the project's model at 64
  rollouts per step (two micro-batches of 32) this tr(Σ) came out about 30% above the
  consecutive-step one and its |G|² below zero on average over 320 steps, by several standard
  errors. It is kept as a diagnostic and for batches that sit near or above the noise scale.

>>> est = two_batch_estimate(small_sq=2.0, b_small=8, big_sq=1.25, b_big=32)
>>> est.grad_sq, est.trace, est.trace / est.grad_sq          # |G|² = 1, tr(Σ) = 8: B_simple = 8
(1.0, 8.0, 8.0)
>>> ema = NoiseScaleEMA(decay=0.5)
>>> ema.update(est), ema.update(GradientNoise(grad_sq=3.5, trace=12.0))  # (.25*8 + .5*12) / (.25*1 + .5*3.5)
(8.0, 4.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class GradientNoise:
    """One step's unbiased estimates of |G|² (``grad_sq``) and tr(Σ) (``trace``), per rollout.

    ``small_sq``/``big_sq``: the squared norms they came from (the normaliser-weighted mean of
    the micro-batches' and the whole step's); ``b_small``/``b_big``: the batch sizes, in
    rollouts (``b_small`` is the effective size of one micro-batch when they differ).
    """

    grad_sq: float
    trace: float
    small_sq: float = math.nan
    big_sq: float = math.nan
    b_small: float = math.nan
    b_big: float = math.nan


def two_batch_estimate(small_sq: float, b_small: float, big_sq: float, b_big: float) -> GradientNoise:
    """McCandlish et al.'s estimates from |G_small|² at ``b_small`` and |G_big|² at ``b_big``.

    >>> two_batch_estimate(small_sq=5.0, b_small=1, big_sq=2.0, b_big=4).trace   # (5 - 2) / (1 - 1/4)
    4.0
    """
    if not 0 < b_small < b_big:
        raise ValueError(f"batch sizes b_small={b_small}, b_big={b_big}: need 0 < b_small < b_big")
    grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return GradientNoise(grad_sq, trace, small_sq, big_sq, float(b_small), float(b_big))


def partition_estimate(
    parts_sq: Sequence[float], shares: Sequence[float], sizes: Sequence[float], big_sq: float
) -> GradientNoise:
    """The estimates from a batch split into K >= 2 parts (see the module docstring).

    ``parts_sq[k]`` = |G_k|², part k's gradient rescaled to its own normaliser; ``shares[k]``
    = f_k, its share of the batch's normaliser (they sum to 1); ``sizes[k]`` = b_k rollouts;
    ``big_sq`` = |G_big|² of the whole batch (G_big = Σ f_k G_k).

    Two equal halves are the two-batch formula with B_small = B_big / 2:

    >>> a = partition_estimate([3.0, 1.0], [0.5, 0.5], [16, 16], big_sq=1.25)
    >>> b = two_batch_estimate(small_sq=2.0, b_small=16, big_sq=1.25, b_big=32)
    >>> (a.trace, a.grad_sq, a.b_small), (b.trace, b.grad_sq)
    ((24.0, 0.5, 16.0), (24.0, 0.5))
    """
    if len(parts_sq) < 2 or not len(parts_sq) == len(shares) == len(sizes):
        raise ValueError(
            f"need >= 2 parts with one share and one size each; got {len(parts_sq)}, {len(shares)}, {len(sizes)}"
        )
    if any(f <= 0 for f in shares) or any(b <= 0 for b in sizes):
        raise ValueError(f"shares {list(shares)} and sizes {list(sizes)} must all be > 0")
    small_sq = sum(f * q for f, q in zip(shares, parts_sq))
    spread = sum(f * (1.0 - f) / b for f, b in zip(shares, sizes))  # E[Σ f_k |G_k - G_big|²] / tr(Σ)
    trace = (small_sq - big_sq) / spread
    grad_sq = big_sq - trace * sum(f * f / b for f, b in zip(shares, sizes))
    b_big = float(sum(sizes))
    return GradientNoise(grad_sq, trace, small_sq, big_sq, 1.0 / (spread + 1.0 / b_big), b_big)


class NoiseScaleEMA:
    """B_simple = EMA(tr(Σ)) / EMA(|G|²) over the steps measured so far (``decay`` per step).

    ``value`` is NaN before the first step and while EMA(|G|²) <= 0 (noise so large that the
    gradient itself is not yet resolved).

    >>> ema = NoiseScaleEMA(0.9)
    >>> math.isnan(ema.value), ema.update(GradientNoise(grad_sq=2.0, trace=64.0))
    (True, 32.0)
    """

    def __init__(self, decay: float = 0.99):
        if not 0 <= decay < 1:
            raise ValueError(f"noise-scale EMA decay {decay} must lie in [0, 1)")
        self.decay = decay
        self.grad_sq = 0.0
        self.trace = 0.0
        self.steps = 0

    def update(self, est: GradientNoise) -> float:
        """Fold in one step's estimates; returns the new ``value``."""
        if math.isfinite(est.grad_sq) and math.isfinite(est.trace):
            self.grad_sq = self.decay * self.grad_sq + (1 - self.decay) * est.grad_sq
            self.trace = self.decay * self.trace + (1 - self.decay) * est.trace
            self.steps += 1
        return self.value

    @property
    def value(self) -> float:
        return self.trace / self.grad_sq if self.steps and self.grad_sq > 0 else math.nan

    def state_dict(self) -> dict[str, Any]:
        return {"grad_sq": self.grad_sq, "trace": self.trace, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.grad_sq, self.trace, self.steps = float(state["grad_sq"]), float(state["trace"]), int(state["steps"])


def consecutive_estimate(big_sq: float, dot_prev: float, b_big: float) -> GradientNoise:
    """The consecutive-step estimates from |G_t|² (``big_sq``), G_t · G_(t-1) (``dot_prev``) and
    the step's rollouts ``b_big``.

    >>> est = consecutive_estimate(big_sq=1.5, dot_prev=1.0, b_big=64)   # tr(Σ) = 64 * 0.5
    >>> est.grad_sq, est.trace, est.trace / est.grad_sq
    (1.0, 32.0, 32.0)
    """
    return GradientNoise(float(dot_prev), float(b_big) * (big_sq - dot_prev), big_sq=float(big_sq), b_big=float(b_big))


class PreviousStepGradient:
    """G_t · G_(t-1): this step's accumulated gradient with the previous step's (a copy of one
    gradient is kept, and checkpointed with the learner; call before clipping, which scales the
    gradient in place).

    >>> w = torch.nn.Parameter(torch.zeros(2))
    >>> prev = PreviousStepGradient()
    >>> w.grad = torch.tensor([1.0, 2.0]); prev.dot_and_keep([w]) is None
    True
    >>> w.grad = torch.tensor([3.0, -1.0]); prev.dot_and_keep([w])
    1.0
    """

    def __init__(self) -> None:
        self._kept: list[torch.Tensor | None] | None = None

    def dot_and_keep(self, params: Sequence[torch.Tensor]) -> float | None:
        grads = [p.grad for p in params]
        dot = None
        if self._kept is not None and len(self._kept) == len(grads):
            dot = sum(
                float(torch.vdot(g.flatten(), k.flatten()))
                for g, k in zip(grads, self._kept)
                if g is not None and k is not None
            )
        self._kept = [g.detach().clone() if g is not None else None for g in grads]
        return dot

    def reset(self) -> None:
        self._kept = None

    def state_dict(self) -> dict[str, Any]:
        return {"kept": None if self._kept is None else [None if g is None else g.clone() for g in self._kept]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kept = state.get("kept")
        self._kept = None if kept is None else [None if g is None else g.clone() for g in kept]


class MicroBatchGradients:
    """Reads each micro-batch's own gradient out of an accumulating backward loop, without
    changing what accumulates (see the module docstring).

    Call ``before()`` before a micro-batch's backward and ``after(share, rows)`` after it;
    ``estimate(big_sq)`` then gives the step's ``GradientNoise`` (None with fewer than two
    micro-batches, or a zero share).

    >>> w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    >>> probe = MicroBatchGradients([w])
    >>> for x, share in ((torch.tensor([3.0, 1.0]), 0.5), (torch.tensor([1.0, -1.0]), 0.5)):
    ...     probe.before(); (w @ x * share).backward(); probe.after(share, rows=4)
    >>> w.grad.tolist(), [round(q, 5) for q in probe.parts_sq]   # accumulated as usual; |G_k|² = |x_k|²
    ([2.0, 0.0], [10.0, 2.0])
    >>> est = probe.estimate(big_sq=4.0)
    >>> round(est.trace, 4), round(est.grad_sq, 4)   # (6 - 4) / (2 * 0.25 / 4); 4 - 16 * 2 * 0.25 / 4
    (16.0, 2.0)
    """

    def __init__(self, params: Sequence[torch.Tensor]):
        self._params = list(params)
        self._stash: list[torch.Tensor | None] = []
        self.parts_sq: list[float] = []
        self.shares: list[float] = []
        self.sizes: list[float] = []

    def before(self) -> None:
        self._stash = [p.grad for p in self._params]
        for p in self._params:
            p.grad = None

    def after(self, share: float, rows: float) -> None:
        fresh = [p.grad for p in self._params if p.grad is not None]
        sq = float(torch.nn.utils.get_total_norm(fresh, 2.0)) ** 2 if fresh else 0.0
        for p, kept in zip(self._params, self._stash):
            if kept is None:
                continue
            if p.grad is not None:
                kept.add_(p.grad)  # what autograd's accumulation would have computed, bit for bit
            p.grad = kept
        self._stash = []
        self.parts_sq.append(sq / share**2 if share > 0 else math.nan)
        self.shares.append(float(share))
        self.sizes.append(float(rows))

    def estimate(self, big_sq: float) -> GradientNoise | None:
        if len(self.parts_sq) < 2 or any(f <= 0 for f in self.shares) or not math.isfinite(big_sq):
            return None
        return partition_estimate(self.parts_sq, self.shares, self.sizes, big_sq)
