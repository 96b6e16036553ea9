"""The PPO-clip policy loss of the GRPO family, as pure functions of tensors.

Shapes: ``logprobs``, ``old_logprobs``, ``mask`` (and optional ``ref_logprobs``,
``entropy``) are ``[B, T]`` (B sequences, T response positions, ``mask`` 1 on real tokens);
``advantages`` is ``[B]`` (one per sequence, broadcast over its tokens) or ``[B, T]``.

Per token, with ratio rho = exp(logprobs - old_logprobs) and advantage A::

    loss_t = -min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A) + kl_coef k3_t
    k3_t   = exp(ref - logprobs) - (ref - logprobs) - 1          (>= 0; the k3 KL estimator)

``clip_high > clip_low`` is DAPO's clip-higher. Aggregation turns ``loss_t`` into one number
as a weighted sum, sum_t w_t loss_t, with the weights of ``token_weights``; a caller that
splits a batch into micro-batches passes the *whole batch's* token and sequence counts, so
the micro-batch losses add up to exactly the full-batch loss (and so do their gradients).

>>> import torch
>>> lp = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
>>> out = ppo_clip_loss(lp, lp, torch.tensor([1.0, -1.0]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
>>> round(float(out.loss), 4), out.clip_frac, out.tokens   # (-1 - 1 + 1) / 3 tokens
(-0.3333, 0.0, 3.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AGGREGATIONS = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean")
MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: keeps a badly stale token's ratio finite


def token_weights(
    mask: torch.Tensor, agg: str, num_tokens: float | None = None, num_seqs: float | None = None
) -> torch.Tensor:
    """Per-token weights w (``[B, T]``) such that ``(w * loss_t).sum()`` aggregates as ``agg``.

    ``num_tokens`` / ``num_seqs`` are the normalisers (default: this mask's own counts);
    pass the full batch's counts when ``mask`` is one micro-batch of it.

    * ``token_mean``: w = 1 / num_tokens
    * ``seq_mean_token_sum``: w = 1 / num_seqs
    * ``seq_mean_token_mean``: w = 1 / (len_i * num_seqs) for the tokens of sequence i

    >>> m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    >>> token_weights(m, "token_mean").tolist()
    [[0.25, 0.25, 0.25], [0.25, 0.0, 0.0]]
    >>> [[round(w, 3) for w in row] for row in token_weights(m, "seq_mean_token_mean").tolist()]
    [[0.167, 0.167, 0.167], [0.5, 0.0, 0.0]]
    """
    mask = mask.to(torch.float32)
    if agg == "token_mean":
        n = float(mask.sum()) if num_tokens is None else float(num_tokens)
        return mask / max(n, 1.0)
    seqs = float((mask.sum(-1) > 0).sum()) if num_seqs is None else float(num_seqs)
    if agg == "seq_mean_token_sum":
        return mask / max(seqs, 1.0)
    if agg == "seq_mean_token_mean":
        lengths = mask.sum(-1, keepdim=True).clamp(min=1.0)
        return mask / (lengths * max(seqs, 1.0))
    raise ValueError(f"loss aggregation {agg!r} is not one of {', '.join(AGGREGATIONS)}; set learner.loss_agg")


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference) from samples of the policy:
    exp(ref - lp) - (ref - lp) - 1. Unbiased, non-negative, 0 where the two agree.

    >>> float(k3_kl(torch.tensor([-1.0]), torch.tensor([-1.0])))
    0.0
    """
    d = (ref_logprobs - logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.exp(d) - d - 1.0


@dataclass(frozen=True)
class PolicyLoss:
    """The aggregated loss (with grad) and detached diagnostics over the masked tokens.

    ``clip_frac``: fraction of tokens whose clipped term is active (their gradient is 0);
    ``approx_kl``: token mean of the k3 estimate of KL(old || new) (0 on-policy);
    ``kl_ref``: token mean of k3 against the reference (0 without one);
    ``entropy``: token mean of the given entropies (NaN when none were given);
    ``tokens``: number of masked tokens, to combine the means of several micro-batches.
    """

    loss: torch.Tensor
    clip_frac: float
    approx_kl: float
    kl_ref: float
    entropy: float
    tokens: float


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: str = "token_mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
) -> PolicyLoss:
    """The clipped surrogate (plus optional k3 KL penalty), aggregated as ``agg``.

    Gradients flow through ``logprobs`` only. A ratio above 1 + clip_high with a positive
    advantage (or below 1 - clip_low with a negative one) has zero gradient.

    >>> lp = torch.tensor([[0.0]], requires_grad=True)
    >>> old = torch.tensor([[-0.5]])           # ratio e^0.5 = 1.65 > 1.28
    >>> out = ppo_clip_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 1), clip_high=0.28)
    >>> out.loss.backward(); float(lp.grad), out.clip_frac
    (0.0, 1.0)
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask {tuple(mask.shape)} "
            "must have the same [B, T] shape"
        )
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)
    if adv.dim() == 1:
        adv = adv[:, None]
    log_ratio = (logprobs - old_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl_ref = None
    if ref_logprobs is not None and kl_coef > 0:
        kl_ref = k3_kl(logprobs, ref_logprobs)
        per_token = per_token + kl_coef * kl_ref
    weights = token_weights(mask, agg, num_tokens, num_seqs).to(per_token.dtype)
    # where() rather than multiply: a masked position's loss may be inf/NaN (padding), and
    # 0 * inf would poison the sum and the gradient.
    loss = torch.where(mask > 0, per_token * weights, torch.zeros_like(per_token)).sum()

    with torch.no_grad():
        n = float(mask.sum())

        def token_mean(x: torch.Tensor) -> float:
            return float(torch.where(mask > 0, x, torch.zeros_like(x)).sum()) / n if n else 0.0

        clip_active = (clipped < unclipped).to(per_token.dtype)
        approx_kl = token_mean((ratio - 1.0) - log_ratio)
        return PolicyLoss(
            loss=loss,
            clip_frac=token_mean(clip_active),
            approx_kl=approx_kl,
            kl_ref=token_mean(kl_ref) if kl_ref is not None else 0.0,
            entropy=token_mean(entropy.to(per_token.dtype)) if entropy is not None else float("nan"),
            tokens=n,
        )
