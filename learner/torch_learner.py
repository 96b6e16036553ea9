"""The real learner: PPO-clip policy-gradient steps on a transformers causal LM.

One ``step(batch)``:

1. advantages per group (``pipeline.advantages``; variable-size groups), and which groups
   enter the loss (all, or only the non-saturated ones with ``mask_saturated``);
2. rollouts packed into right-padded micro-batches (``learner.packing``), scored by
   ``learner.scoring``;
3. for each of ``ppo_epochs``: for every micro-batch, the response tokens' log-probs under
   the current policy, the clipped surrogate against the engine's log-probs (the "old"
   policy; the engines report log-probs at temperature 1, the distribution scored here),
   aggregated with batch-wide normalisers so that micro-batching does not change the
   gradient; backward; then one clipped-gradient AdamW step;
4. ``policy_version`` + 1 and ``learner/…`` metrics, among them the simple gradient noise
   scale ``learner/noise_scale`` (in rollouts) from this step's gradient and the previous
   step's, and ``learner/noise_scale_micro`` from the first epoch's micro-batch gradients, with
   no extra pass and no change to the update (setting ``learner.noise_scale``; the method is in
   the ``learner.noise_scale`` module).

On-policy data gives a ratio of 1 up to numerics (engine and learner run the same weights);
stale samples (from an engine that ran ahead by ``max_async_steps``) are clipped like any
off-policy PPO sample. The model stays in eval mode: dropout would make the ratio of
on-policy data differ from 1. The learner draws its random numbers (dropout, if ever turned
on) from a private stream saved in ``state_dict``, so a resumed run repeats exactly.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from pipeline.types import CommittedGroup, FinishReason, Rollout, TrainBatch
>>> _ = torch.manual_seed(0)
>>> model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
...     num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=32))
>>> learner = TorchLearner(model, LearnerConfig(), pad_id=0)
>>> def rollout(i, tokens, reward):
...     r = Rollout(f"g0.s{i}", i, (1, 5), tokens, (0.0,) * len(tokens), reward, FinishReason.STOP, 0)
...     return Rollout(r.request_id, i, r.prompt_token_ids, tokens, learner.logprobs([r])[0], reward, r.finish_reason, 0)
>>> batch = TrainBatch(0, (CommittedGroup(0, 0, (rollout(0, (7, 2), 1.0), rollout(1, (8, 9, 2), 0.0)), 2, 5),))
>>> result = learner.step(batch)
>>> result.policy_version, result.metrics["learner/tokens"], result.metrics["learner/clip_frac"]
(1, 5.0, 0.0)
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from learner.config import LearnerConfig
from learner.losses import ppo_clip_loss
from learner.noise_scale import (
    GradientNoise,
    MicroBatchGradients,
    NoiseScaleEMA,
    PreviousStepGradient,
    consecutive_estimate,
)
from learner.packing import BatchError, Chunk, pack
from learner.scoring import response_logprobs
from learner.turn_credit import token_advantages, turn_advantages
from pipeline.advantages import compute_advantages, saturated_mask
from pipeline.types import Rollout, StepResult, TrainBatch


class TorchLearner:
    """Implements the ``pipeline.protocols.Learner`` protocol for a transformers causal LM.

    Parameters
    ----------
    model
        The policy (any ``AutoModelForCausalLM``-style module returning ``.logits``); trained
        in place. The engine must hold its own copy (it is fed through ``weights()``).
    config
        ``LearnerConfig``.
    pad_id
        Token id used to right-pad rows; never scored.
    ref_model
        Reference policy for the KL penalty; used only when ``config.kl_coef > 0``, and then
        defaulting to a frozen copy of ``model`` as it is at construction.
    """

    def __init__(
        self, model: torch.nn.Module, config: LearnerConfig, pad_id: int, ref_model: torch.nn.Module | None = None
    ):
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.model = model
        self.config = config
        self.pad_id = int(pad_id)
        self.ref_model = None
        if config.kl_coef > 0:
            self.ref_model = ref_model if ref_model is not None else copy.deepcopy(model)
            self.ref_model.requires_grad_(False).eval()
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise ValueError(
                "the model has no trainable parameters (all requires_grad=False); unfreeze it before training"
            )
        self.device = self._params[0].device
        self.optimizer = torch.optim.AdamW(
            self._params, lr=config.lr, betas=tuple(config.betas), eps=config.adam_eps, weight_decay=config.weight_decay
        )
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        self.vocab_size = int(vocab) if vocab else None
        self._version = 0
        self.noise = NoiseScaleEMA(config.noise_scale_ema) if config.noise_scale else None  # consecutive steps
        self.noise_micro = NoiseScaleEMA(config.noise_scale_ema) if config.noise_scale else None  # micro-batches
        self._previous = PreviousStepGradient()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self._rng_state = torch.get_rng_state()

    @property
    def policy_version(self) -> int:
        """Optimisation steps taken (a batch counts once, whatever ``ppo_epochs``)."""
        return self._version

    # --- the protocol ----------------------------------------------------------------------

    def advantages(self, batch: TrainBatch) -> tuple[tuple[float, ...], ...]:
        """Per-group advantages of ``batch`` under ``config.algorithm`` (``pipeline.advantages``):
        what ``step`` trains on and reports in its ``StepResult.advantages``."""
        return compute_advantages(
            batch.groups, self.config.algorithm, eps=self.config.adv_eps, ddof=self.config.std_ddof
        )

    def step(self, batch: TrainBatch) -> StepResult:
        """One optimisation step (``ppo_epochs`` of them) on ``batch``; see the module docstring."""
        start = time.perf_counter()
        cfg = self.config
        plan = self._plan(batch)  # 1) and 2)
        # 3) ppo_epochs optimiser steps over the whole batch
        totals = dict(loss=0.0, grad_norm=0.0, clip=0.0, kl=0.0, kl_ref=0.0, ent=0.0, tokens=0.0, skipped=0.0)
        epochs = cfg.ppo_epochs if plan.chunks else 0
        noise: GradientNoise | None = None
        big_sq = dot_prev = None
        with self._private_rng(keep=True):
            for epoch in range(epochs):
                self.optimizer.zero_grad(set_to_none=True)
                # the noise scale is measured on the first epoch (the on-policy gradient)
                probe = MicroBatchGradients(self._params) if self.noise is not None and epoch == 0 else None
                self._backward(plan, totals, probe)
                if probe is not None:  # before clipping scales the gradient in place
                    dot_prev = self._previous.dot_and_keep(self._params)
                grad_norm = float(
                    torch.nn.utils.clip_grad_norm_(self._params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
                )
                if probe is not None:
                    noise, big_sq = probe.estimate(grad_norm**2), grad_norm**2
                    if not math.isfinite(grad_norm):
                        self._previous.reset()
                totals["grad_norm"] += grad_norm
                if math.isfinite(grad_norm):
                    self.optimizer.step()
                else:  # a NaN/inf gradient would destroy the weights: skip, and say so
                    totals["skipped"] += 1
        self.optimizer.zero_grad(set_to_none=True)
        # 4) report
        self._version += 1
        tok = totals["tokens"] or 1.0
        metrics = dict(plan.metrics)
        metrics.update(
            {
                "learner/loss": totals["loss"] / max(epochs, 1),
                "learner/grad_norm": totals["grad_norm"] / max(epochs, 1),
                "learner/clip_frac": totals["clip"] / tok,
                "learner/approx_kl": totals["kl"] / tok,
                "learner/entropy": totals["ent"] / tok,
                "learner/tokens": plan.num_tokens,
                # an all-saturated batch under mask_saturated has nothing to train on: no update
                "learner/skipped_steps": totals["skipped"] if plan.chunks else float(cfg.ppo_epochs),
                "learner/lr": float(self.optimizer.param_groups[0]["lr"]),
                "learner/step_s": time.perf_counter() - start,
            }
        )
        if self.ref_model is not None:
            metrics["learner/kl_ref"] = totals["kl_ref"] / tok
        metrics.update(self._noise_metrics(noise, plan, big_sq, dot_prev))
        return StepResult(step=batch.step, policy_version=self._version, metrics=metrics, advantages=plan.advantages)

    def compute_gradients(self, batch: TrainBatch) -> dict[str, torch.Tensor]:
        """The gradient of ``batch``'s loss under the current policy, by parameter name, with no
        optimiser step and no change of state (for tests and diagnostics)."""
        plan = self._plan(batch)
        self.optimizer.zero_grad(set_to_none=True)
        with self._private_rng(keep=False):
            self._backward(plan, dict.fromkeys(("loss", "clip", "kl", "kl_ref", "ent", "tokens"), 0.0))
        grads = {
            name: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for name, p in self.model.named_parameters()
            if p.requires_grad
        }
        self.optimizer.zero_grad(set_to_none=True)
        return grads

    def weights(self) -> dict[str, torch.Tensor]:
        """A detached copy of the policy's state dict, for the engine's in-place ``load_state_dict``."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """Model, optimiser, RNG stream and version: everything an exact resume needs (copies)."""
        state = {
            "model": self.weights(),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "rng": self._rng_state.clone(),
            "version": self._version,
        }
        if self.noise is not None:
            state["noise_scale"] = {
                "steps": self.noise.state_dict(),
                "micro": self.noise_micro.state_dict(),
                "previous": self._previous.state_dict(),
            }
        if self.ref_model is not None:
            state["ref_model"] = {k: v.detach().clone() for k, v in self.ref_model.state_dict().items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [k for k in ("model", "optimizer", "rng", "version") if k not in state]
        if missing:
            raise KeyError(f"learner state lacks {', '.join(missing)}; pass what TorchLearner.state_dict() returned")
        self.model.load_state_dict(state["model"])
        # load_state_dict keeps tensors it is given when dtype and device already match:
        # copy, or later steps would mutate the caller's checkpoint in place.
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self._rng_state = state["rng"].clone()
        self._version = int(state["version"])
        if self.noise is not None and "noise_scale" in state:  # absent from checkpoints written before it existed
            self.noise.load_state_dict(state["noise_scale"]["steps"])
            self.noise_micro.load_state_dict(state["noise_scale"]["micro"])
            self._previous.load_state_dict(state["noise_scale"]["previous"])
        if self.ref_model is not None and "ref_model" in state:
            self.ref_model.load_state_dict(state["ref_model"])

    # --- one step's pieces -------------------------------------------------------------------

    def _plan(self, batch: TrainBatch) -> _Plan:
        cfg = self.config
        _check_batch(batch)
        # 1) advantages, and the rollouts that enter the loss
        advantages = self.advantages(batch)
        saturated = saturated_mask(batch.groups)
        rows: list[Rollout] = []
        row_adv: list[float] = []
        token_adv: list[np.ndarray | None] = []
        for group, adv, sat in zip(batch.groups, advantages, saturated):
            if not (sat and cfg.mask_saturated):
                rows.extend(group.rollouts)
                row_adv.extend(adv)
                token_adv.extend(self._token_advantages(group.rollouts, adv))
        # 2) micro-batches; the loss normalisers are the whole batch's
        per_row = [a if t is None else t for a, t in zip(row_adv, token_adv)]
        chunks = pack(rows, per_row, self.pad_id, cfg.micro_batch, self.vocab_size, self.device, cfg.share_prompts)
        return _Plan(
            chunks=chunks,
            num_tokens=float(
                sum(chunk.num_tokens for chunk in chunks)
            ),  # trained tokens: not an episode's observations
            num_seqs=float(len(rows)),
            metrics=_batch_metrics(batch, advantages, saturated, row_adv, self._version),
            advantages=advantages,
        )

    def _token_advantages(self, rollouts: Sequence[Rollout], adv: Sequence[float]) -> list[np.ndarray | None]:
        """Per-token advantages of a group's episodes under ``turn_credit`` (None: the row's one advantage)."""
        weight = self.config.turn_credit
        if weight == 0 or all(r.turns is None for r in rollouts):
            return [None] * len(rollouts)
        per_turn = turn_advantages([r.turns for r in rollouts], eps=self.config.adv_eps, ddof=self.config.std_ddof)
        return [
            None if r.turns is None or t is None else token_advantages(a, r.turns, t, weight)
            for r, a, t in zip(rollouts, adv, per_turn)
        ]

    def _backward(self, plan: _Plan, totals: dict[str, float], probe: MicroBatchGradients | None = None) -> None:
        """Accumulate the gradient of the whole batch's loss, one micro-batch at a time
        (``probe`` reads each micro-batch's own gradient on the way)."""
        self.model.train(False)
        for chunk in plan.chunks:
            out = self._chunk_loss(chunk, plan.num_tokens, plan.num_seqs)
            if probe is not None:
                probe.before()
            out.loss.backward()
            if probe is not None:
                share = self._share(chunk, plan)
                probe.after(share, share * plan.num_seqs)  # its effective size in rollouts
            totals["loss"] += float(out.loss.detach())
            for key, value in (
                ("clip", out.clip_frac),
                ("kl", out.approx_kl),
                ("kl_ref", out.kl_ref),
                ("ent", out.entropy),
            ):
                totals[key] += value * out.tokens
            totals["tokens"] += out.tokens

    def _share(self, chunk: Chunk, plan: _Plan) -> float:
        """The chunk's share of the batch's loss normaliser (tokens for a token mean, else rollouts)."""
        if self.config.loss_agg == "token_mean":
            return chunk.num_tokens / max(plan.num_tokens, 1.0)
        return len(chunk.index) / max(plan.num_seqs, 1.0)

    def _noise_metrics(
        self, micro: GradientNoise | None, plan: _Plan, big_sq: float | None, dot_prev: float | None
    ) -> dict[str, float]:
        """This step's gradient-noise estimates and the moving-average noise scales (when defined)."""
        if self.noise is None or self.noise_micro is None:
            return {}
        out: dict[str, float] = {}
        if big_sq is not None and math.isfinite(big_sq):
            out["learner/grad_sq_big"] = big_sq
            if dot_prev is not None and math.isfinite(dot_prev):
                est = consecutive_estimate(big_sq, dot_prev, plan.num_seqs)
                self.noise.update(est)
                out.update({"learner/grad_dot_prev": dot_prev, "learner/trace_sigma": est.trace})
        if micro is not None:
            self.noise_micro.update(micro)
            out.update(
                {
                    "learner/grad_sq_small": micro.small_sq,
                    "learner/grad_sq_micro": micro.grad_sq,
                    "learner/trace_sigma_micro": micro.trace,
                    "learner/noise_batch_small": micro.b_small,
                }
            )
        for key, ema in (("learner/noise_scale", self.noise), ("learner/noise_scale_micro", self.noise_micro)):
            if math.isfinite(ema.value):
                out[key] = ema.value
        return out

    @contextlib.contextmanager
    def _private_rng(self, keep: bool):
        """Run with the learner's own torch RNG stream (saved back when ``keep``); the
        process-wide stream is left as it was."""
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self._rng_state)
            yield
            if keep:
                self._rng_state = torch.get_rng_state()

    # --- scoring -----------------------------------------------------------------------------

    @torch.no_grad()
    def logprobs(self, rollouts: Sequence[Rollout]) -> list[tuple[float, ...]]:
        """Log-probs of each rollout's response tokens under the current policy (temperature 1),
        in the order given; the rollouts' own ``logprobs`` are not used."""
        stub = [
            Rollout(
                r.request_id,
                r.sample_index,
                r.prompt_token_ids,
                r.token_ids,
                (0.0,) * len(r.token_ids),
                r.reward,
                r.finish_reason,
                r.policy_version,
            )
            for r in rollouts
        ]
        out: list[tuple[float, ...]] = [()] * len(stub)
        self.model.train(False)
        chunks = pack(
            stub,
            [0.0] * len(stub),
            self.pad_id,
            self.config.micro_batch,
            self.vocab_size,
            self.device,
            self.config.share_prompts,
        )
        for chunk in chunks:
            lp, _ = response_logprobs(self.model, chunk, entropy=False, dtype=self.config.dtype)
            for row, i in enumerate(chunk.index):
                out[i] = tuple(lp[row][chunk.loss_mask[row]].tolist())
        return out

    def _chunk_loss(self, chunk: Chunk, num_tokens: float, num_seqs: float):
        cfg = self.config
        logprobs, entropy = response_logprobs(self.model, chunk, entropy=True, dtype=cfg.dtype)
        if self.ref_model is not None and chunk.ref_logprobs is None:
            with torch.no_grad():  # the reference is fixed: score it once per batch, not per epoch
                chunk.ref_logprobs = response_logprobs(self.ref_model, chunk, entropy=False, dtype=cfg.dtype)[0]
        return ppo_clip_loss(
            logprobs,
            chunk.old_logprobs,
            chunk.advantages,
            chunk.loss_mask,
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            agg=cfg.loss_agg,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            ref_logprobs=chunk.ref_logprobs,
            kl_coef=cfg.kl_coef,
            entropy=entropy,
        )


@dataclass
class _Plan:
    """A batch made ready for the loss: its micro-batches, normalisers and batch metrics."""

    chunks: list[Chunk]
    num_tokens: float
    num_seqs: float
    metrics: dict[str, float]
    advantages: tuple[tuple[float, ...], ...]


def _check_batch(batch: TrainBatch) -> None:
    if not batch.groups:
        raise BatchError(f"TrainBatch(step={batch.step}) has no groups; the learner needs at least one committed group")
    for group in batch.groups:
        if not group.rollouts:
            raise BatchError(
                f"group {group.group_id} of step {batch.step} has no rollouts; commit only groups with finished samples"
            )


def _batch_metrics(
    batch: TrainBatch,
    advantages: Sequence[Sequence[float]],
    saturated: Sequence[bool],
    trained_adv: Sequence[float],
    version: int,
) -> dict[str, float]:
    rewards = [r.reward for g in batch.groups for r in g.rollouts]
    versions = [r.policy_version for g in batch.groups for r in g.rollouts]
    n = len(trained_adv)
    mean_adv = sum(trained_adv) / n if n else 0.0
    return {
        "learner/reward_mean": sum(rewards) / len(rewards),
        "learner/adv_std": math.sqrt(sum((a - mean_adv) ** 2 for a in trained_adv) / n) if n else 0.0,
        "learner/adv_abs_mean": sum(abs(a) for g in advantages for a in g) / len(rewards),
        "learner/rollouts": float(len(rewards)),
        "learner/rollouts_trained": float(n),
        "learner/groups": float(len(batch.groups)),
        "learner/saturated_frac": sum(saturated) / len(saturated),
        "learner/staleness_max": float(version - min(versions)),
        "learner/staleness_mean": version - sum(versions) / len(versions),
    }
