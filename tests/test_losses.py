"""The PPO-clip loss on hand-made tensors: gradients, clipping, aggregation, KL; and the config."""

from __future__ import annotations

import math

import pytest
import torch

from learner.config import LearnerConfig
from learner.losses import k3_kl, ppo_clip_loss, token_weights
from pipeline.config.build import ConfigError, build

torch.set_num_threads(1)


def _grad(lp_values, old_values, adv, mask=None, **kw):
    lp = torch.tensor(lp_values, dtype=torch.float32, requires_grad=True)
    old = torch.tensor(old_values, dtype=torch.float32)
    mask = torch.ones_like(old) if mask is None else torch.tensor(mask, dtype=torch.float32)
    out = ppo_clip_loss(lp, old, torch.tensor(adv, dtype=torch.float32), mask, **kw)
    out.loss.backward()
    return out, lp.grad


def test_zero_advantages_give_zero_loss_and_zero_gradient():
    out, grad = _grad([[-1.0, -2.0], [-0.5, -3.0]], [[-1.2, -1.0], [-0.5, -3.0]], [0.0, 0.0])
    assert out.loss.item() == 0.0
    assert torch.count_nonzero(grad) == 0


def test_on_policy_gradient_is_minus_advantage_over_token_count():
    # ratio = 1: d loss / d logprob = -A / N (the plain policy gradient, token-mean)
    out, grad = _grad([[-1.0, -2.0, -0.5]], [[-1.0, -2.0, -0.5]], [2.0], mask=[[1, 1, 0]])
    assert grad[0].tolist() == pytest.approx([-1.0, -1.0, 0.0])
    assert out.clip_frac == 0.0 and out.approx_kl == pytest.approx(0.0, abs=1e-7)


def test_ratio_above_one_plus_clip_high_gives_zero_gradient_for_positive_advantage():
    ratio = 1.3  # above 1 + 0.28
    out, grad = _grad([[math.log(ratio)]], [[0.0]], [1.0], clip_low=0.2, clip_high=0.28)
    assert float(grad) == 0.0 and out.clip_frac == 1.0
    assert out.loss.item() == pytest.approx(-1.28)


def test_clip_higher_lets_a_ratio_between_the_two_bounds_still_grow():
    ratio = 1.25  # clipped by the symmetric 0.2, not by DAPO's 0.28
    _, symmetric = _grad([[math.log(ratio)]], [[0.0]], [1.0], clip_low=0.2, clip_high=0.2)
    out, higher = _grad([[math.log(ratio)]], [[0.0]], [1.0], clip_low=0.2, clip_high=0.28)
    assert float(symmetric) == 0.0
    assert float(higher) == pytest.approx(-ratio) and out.clip_frac == 0.0


def test_negative_advantage_is_clipped_below_and_pessimistic_above():
    _, below = _grad([[math.log(0.7)]], [[0.0]], [-1.0])  # ratio < 1 - 0.2: no more push down
    _, above = _grad([[math.log(1.5)]], [[0.0]], [-1.0])  # ratio > 1 + 0.2: min() keeps ratio * A
    assert float(below) == 0.0
    assert float(above) == pytest.approx(1.5)


def test_aggregations_against_hand_computation():
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    per_token_adv = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-2.0, 0.0, 0.0, 0.0]])
    lp = torch.zeros(2, 4)
    # on-policy, loss_t = -A_t: token sums are -4 and +2
    losses = {
        agg: ppo_clip_loss(lp, lp, per_token_adv, mask, agg=agg).loss.item()
        for agg in ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean")
    }
    assert losses["token_mean"] == pytest.approx((-4 + 2) / 5)
    assert losses["seq_mean_token_sum"] == pytest.approx((-4 + 2) / 2)
    assert losses["seq_mean_token_mean"] == pytest.approx((-4 / 4 + 2 / 1) / 2)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_micro_batches_with_batch_wide_normalisers_add_up_to_the_full_loss(agg):
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(6, 5, generator=g)
    old = lp + 0.3 * (torch.rand(6, 5, generator=g) - 0.5)
    adv = torch.randn(6, generator=g)
    mask = torch.tensor([[1] * n + [0] * (5 - n) for n in (5, 1, 3, 4, 2, 5)], dtype=torch.float32)
    full = ppo_clip_loss(lp, old, adv, mask, agg=agg).loss
    n_tok, n_seq = float(mask.sum()), 6.0
    parts = sum(
        ppo_clip_loss(lp[s], old[s], adv[s], mask[s], agg=agg, num_tokens=n_tok, num_seqs=n_seq).loss
        for s in (slice(0, 2), slice(2, 3), slice(3, 6))
    )
    assert float(parts) == pytest.approx(float(full), rel=1e-6)


def test_masked_positions_cannot_poison_the_loss():
    lp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.0, float("inf")]])
    out = ppo_clip_loss(lp, old, torch.tensor([1.0]), torch.tensor([[1.0, 0.0]]))
    out.loss.backward()
    assert math.isfinite(out.loss.item()) and torch.isfinite(lp.grad).all()


def test_k3_kl_is_zero_on_agreement_positive_otherwise_and_pulls_towards_the_reference():
    assert float(k3_kl(torch.tensor(-1.0), torch.tensor(-1.0))) == 0.0
    assert float(k3_kl(torch.tensor(-1.0), torch.tensor(-2.0))) > 0
    lp = torch.tensor([[-1.0]], requires_grad=True)
    out = ppo_clip_loss(
        lp, lp.detach(), torch.tensor([0.0]), torch.ones(1, 1), ref_logprobs=torch.tensor([[-2.0]]), kl_coef=0.5
    )
    out.loss.backward()
    assert out.kl_ref > 0 and float(lp.grad) > 0  # descending the loss lowers lp, towards the reference


def test_metrics_clip_fraction_and_entropy_are_token_means():
    lp = torch.log(torch.tensor([[1.5, 1.0, 1.0, 1.0]]))
    out = ppo_clip_loss(
        lp,
        torch.zeros(1, 4),
        torch.tensor([1.0]),
        torch.tensor([[1.0, 1.0, 1.0, 0.0]]),
        entropy=torch.tensor([[0.3, 0.6, 0.9, 100.0]]),
    )
    assert out.clip_frac == pytest.approx(1 / 3) and out.entropy == pytest.approx(0.6) and out.tokens == 3.0
    assert out.approx_kl == pytest.approx((0.5 - math.log(1.5)) / 3)


def test_token_weights_reject_an_unknown_aggregation():
    with pytest.raises(ValueError, match="loss aggregation 'sum' is not one of"):
        token_weights(torch.ones(1, 1), "sum")


def test_config_errors_name_the_key_and_the_fix():
    with pytest.raises(
        ConfigError, match=r"learner.clip_high=0.1 is below learner.clip_low=0.2; .* set clip_high >= clip_low"
    ):
        LearnerConfig(clip_low=0.2, clip_high=0.1)
    with pytest.raises(ConfigError, match="learner.micro_batch=0 must be >= 1"):
        LearnerConfig(micro_batch=0)
    with pytest.raises(ConfigError, match="unknown key 'clip_hihg'; did you mean 'clip_high'"):
        build(LearnerConfig, {"clip_hihg": 0.28})
    with pytest.raises(ConfigError, match="'algorithm'='ppo' is not one of"):
        build(LearnerConfig, {"algorithm": "ppo"})
    cfg = build(LearnerConfig, {"algorithm": "drgrpo", "loss_agg": "seq_mean_token_sum", "betas": [0.9, 0.99]})
    assert cfg.betas == (0.9, 0.99) and cfg.loss_agg == "seq_mean_token_sum"
