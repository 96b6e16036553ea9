"""Settings of the learner package (the ``learner:`` section of a run config).

One frozen dataclass, a docstring under every field; ``pipeline.config.build.build`` turns
YAML into it and rejects unknown keys. The defaults are plain GRPO (std-normalised
advantages, symmetric clip 0.2, token-mean loss, no reference model) at the learning rate
that worked on this machine's 0.4M-parameter policy (3e-4; 1e-3 collapsed it). The baselines
(docs/methods.md, "Advantage estimators and the loss") are combinations of fields:

=====================  =====================================================================
GRPO                   ``algorithm: grpo``, ``loss_agg: token_mean``
Dr.GRPO                ``algorithm: drgrpo``, ``loss_agg: seq_mean_token_sum``
RLOO                   ``algorithm: rloo``
DAPO clip-higher       ``clip_high: 0.28`` (with any estimator; DAPO pairs it with token-mean)
=====================  =====================================================================

>>> LearnerConfig(algorithm="rloo", clip_high=0.28).clip_high
0.28
>>> LearnerConfig(clip_low=0.2, clip_high=0.1)
Traceback (most recent call last):
...
pipeline.config.build.ConfigError: learner.clip_high=0.1 is below learner.clip_low=0.2; DAPO's clip-higher raises clip_high (0.28), it never lowers it: set clip_high >= clip_low
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pipeline.config.build import require

Algorithm = Literal["grpo", "rloo", "drgrpo"]
LossAgg = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]


@dataclass(frozen=True)
class LearnerConfig:
    """The policy-gradient learner (``learner.torch_learner.TorchLearner``)."""

    algorithm: Algorithm = "grpo"
    """Advantage estimator. ``grpo``: (r - group mean) / (group std + adv_eps);
    ``drgrpo``: r - group mean (no std); ``rloo``: r - mean of the other n-1 rewards."""
    loss_agg: LossAgg = "token_mean"
    """How per-token losses become one number. ``token_mean``: sum over every response token
    of the batch / their count (GRPO as DAPO writes it); ``seq_mean_token_sum``: each
    sequence's token sum, averaged over sequences (Dr.GRPO: no length normalisation);
    ``seq_mean_token_mean``: each sequence's token mean, averaged over sequences (the
    original GRPO). Normalisers are always those of the whole batch, whatever micro_batch."""
    clip_low: float = 0.2
    """PPO clip below 1: the ratio's lower bound is 1 - clip_low."""
    clip_high: float = 0.2
    """PPO clip above 1: the ratio's upper bound is 1 + clip_high. 0.2 is GRPO's symmetric
    clip; DAPO's clip-higher uses 0.28 so that unlikely tokens with positive advantage can
    still grow."""
    kl_coef: float = 0.0
    """Weight of the k3 estimate of KL(policy || reference) added per token. 0: no reference
    model is kept (the GRPO-without-KL default of DAPO and Dr.GRPO)."""
    adv_eps: float = 1e-6
    """Added to the group std in the ``grpo`` estimator."""
    std_ddof: int = 1
    """Degrees of freedom of the group std (1: the sample std, as torch.std and the verl/trl
    GRPO implementations compute it; 0: the population std)."""
    mask_saturated: bool = False
    """True: groups whose rewards are all equal leave the loss entirely, so they do not
    count in the token-mean normaliser either. False: they stay with advantage 0 and only
    dilute the token mean (each step's gradient then shrinks with the saturated fraction, as
    in plain GRPO implementations). With ``kl_coef`` > 0 this also decides whether their
    tokens get the KL penalty."""
    turn_credit: float = 0.0
    """Multi-turn episodes: weight of each turn's own advantage (its reward standardised over
    every turn of the group) added to the episode's advantage on that turn's tokens
    (``learner.turn_credit``). 0: the episode's advantage alone. Rollouts without turns are
    unaffected."""
    lr: float = 3e-4
    """AdamW learning rate (constant)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay (torch's default)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW moment decay rates."""
    adam_eps: float = 1e-8
    """AdamW denominator epsilon."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value before each optimiser step (0 = no clipping;
    the norm is still measured and reported)."""
    micro_batch: int = 128
    """Rollouts per forward/backward chunk; bounds activation memory, not the result (the
    gradient is accumulated over chunks with batch-wide normalisers). 128 measured 10-25%
    faster than 256 or 512 on this machine's CPU for the 0.4M-parameter model (cache reuse)."""
    share_prompts: bool = True
    """Run each distinct prompt of a micro-batch once and continue its rollouts from a copy of
    its key/value cache (same log-probs and gradient up to float rounding, about 2x faster on
    the project's tasks). False: every rollout runs as one full prompt + response row."""
    ppo_epochs: int = 1
    """Optimiser steps per train batch, each over the whole batch. With 1 and on-policy data
    the ratio is 1 up to numerics; more epochs reuse the batch and the clip bounds them."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Forward-pass precision. ``bfloat16`` runs the forward under CPU autocast; weights,
    optimiser state and the log-softmax stay float32."""
    num_threads: int = 0
    """``torch.set_num_threads`` at construction (0 = leave torch's setting alone). The
    setting is process-wide: choose it together with the engine's."""
    seed: int = 0
    """Seed of the learner's private torch RNG stream (dropout, if a model has any)."""
    noise_scale: bool = True
    """Estimate the simple gradient noise scale every step (``learner.noise_scale``, in
    rollouts): ``learner/noise_scale`` from this step's gradient and the previous step's (one
    gradient copy kept), ``learner/noise_scale_micro`` from the micro-batches' gradients (needs
    at least two per step: ``micro_batch`` at most half the rollouts trained per step). No extra
    forward or backward pass and the same update bit for bit."""
    noise_scale_ema: float = 0.99
    """Per-step decay of the moving averages of |G|^2 and tr(Sigma) whose ratio is the logged
    noise scale (0.99: about the last 100 steps). Long, because one step's |G|^2 estimate is
    noisy: on the project's model at 256 rollouts per step its noise is about its size."""

    def __post_init__(self) -> None:
        require(self.clip_low >= 0, f"learner.clip_low={self.clip_low} must be >= 0; 0.2 is the usual PPO value")
        require(
            self.clip_low < 1,
            f"learner.clip_low={self.clip_low} must be < 1, or the ratio's lower bound 1 - clip_low is not positive",
        )
        require(
            self.clip_high >= self.clip_low,
            f"learner.clip_high={self.clip_high} is below learner.clip_low={self.clip_low}; DAPO's clip-higher raises "
            "clip_high (0.28), it never lowers it: set clip_high >= clip_low",
        )
        require(self.kl_coef >= 0, f"learner.kl_coef={self.kl_coef} must be >= 0 (0 = no reference model)")
        require(
            self.turn_credit >= 0 and math.isfinite(self.turn_credit),
            f"learner.turn_credit={self.turn_credit} must be a finite number >= 0 (0 = the episode's advantage alone)",
        )
        require(self.adv_eps >= 0, f"learner.adv_eps={self.adv_eps} must be >= 0")
        require(self.std_ddof in (0, 1), f"learner.std_ddof={self.std_ddof} must be 0 (population) or 1 (sample std)")
        require(self.lr > 0, f"learner.lr={self.lr} must be > 0; 3e-4 works for the CPU default model")
        require(self.weight_decay >= 0, f"learner.weight_decay={self.weight_decay} must be >= 0")
        require(
            all(0 <= b < 1 for b in self.betas),
            f"learner.betas={list(self.betas)} must both lie in [0, 1), e.g. [0.9, 0.999]",
        )
        require(self.adam_eps > 0, f"learner.adam_eps={self.adam_eps} must be > 0")
        require(self.grad_clip >= 0, f"learner.grad_clip={self.grad_clip} must be >= 0 (0 = no clipping)")
        require(self.micro_batch >= 1, f"learner.micro_batch={self.micro_batch} must be >= 1 rollout")
        require(self.ppo_epochs >= 1, f"learner.ppo_epochs={self.ppo_epochs} must be >= 1")
        require(
            0 <= self.noise_scale_ema < 1,
            f"learner.noise_scale_ema={self.noise_scale_ema} must lie in [0, 1); 0.99 averages about 100 steps",
        )
        require(
            self.num_threads >= 0, f"learner.num_threads={self.num_threads} must be >= 0 (0 = leave torch's setting)"
        )
