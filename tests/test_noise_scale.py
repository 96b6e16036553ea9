"""The gradient noise scale: known answers on linear regression, and the torch learner's metric.

Linear regression y = x·w* + e with x ~ N(0, I_d), e ~ N(0, s²) and the per-example loss
(x·w - y)² / 2 at w = w* + δ has per-example gradient g = x (x·δ - e), so (Isserlis)
G = E[g] = δ and Σ = Cov[g] = (|δ|² + s²) I + δδᵀ:

    B_simple = tr(Σ) / |G|² = (d (|δ|² + s²) + |δ|²) / |δ|².
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from learner.noise_scale import (
    MicroBatchGradients,
    NoiseScaleEMA,
    PreviousStepGradient,
    consecutive_estimate,
    partition_estimate,
    two_batch_estimate,
)
from tests.test_torch_learner import make_learner, on_policy, random_groups, tiny_llama

D, NOISE_SD = 10, 1.0


def regression_truth(delta: np.ndarray) -> tuple[float, float]:
    """(|G|², tr(Σ)) of the regression problem above."""
    d2 = float(delta @ delta)
    return d2, len(delta) * (d2 + NOISE_SD**2) + d2


def regression_gradients(rng: np.random.Generator, delta: np.ndarray, n: int) -> np.ndarray:
    """``n`` per-example gradients, ``[n, d]``."""
    x = rng.standard_normal((n, len(delta)))
    e = NOISE_SD * rng.standard_normal(n)
    return x * (x @ delta - e)[:, None]


DELTA = np.full(D, 1.0 / math.sqrt(D))  # |δ| = 1: B_simple = (10 * 2 + 1) / 1 = 21


def test_the_closed_form_is_right():
    """Monte Carlo check of the test's own truth, so that the tests below test the estimator."""
    g = regression_gradients(np.random.default_rng(0), DELTA, 400_000)
    grad_sq, trace = regression_truth(DELTA)
    assert float(g.mean(0) @ g.mean(0)) == pytest.approx(grad_sq, rel=0.02)
    assert float(np.trace(np.cov(g.T))) == pytest.approx(trace, rel=0.02)


def test_two_batch_estimate_recovers_the_noise_scale_of_linear_regression():
    rng = np.random.default_rng(1)
    grad_sq, trace = regression_truth(DELTA)
    small, big = [], []
    for _ in range(4000):
        g = regression_gradients(rng, DELTA, 64)
        small.append(float(np.square(g[:8].mean(0)).sum()))
        big.append(float(np.square(g.mean(0)).sum()))
    est = two_batch_estimate(float(np.mean(small)), 8, float(np.mean(big)), 64)
    assert est.grad_sq == pytest.approx(grad_sq, rel=0.1)
    assert est.trace == pytest.approx(trace, rel=0.05)
    assert est.trace / est.grad_sq == pytest.approx(21.0, rel=0.1)


@pytest.mark.parametrize("sizes", [(16, 16, 16, 16), (8, 24, 32)])
def test_partition_estimate_recovers_the_noise_scale_with_equal_and_unequal_parts(sizes):
    rng = np.random.default_rng(2)
    big_b = sum(sizes)
    ema = NoiseScaleEMA(decay=0.999)
    for _ in range(3000):
        g = regression_gradients(rng, DELTA, big_b)
        bounds = np.cumsum((0,) + sizes)
        parts = [g[a:b].mean(0) for a, b in zip(bounds[:-1], bounds[1:])]
        shares = [b / big_b for b in sizes]
        ema.update(partition_estimate([float(p @ p) for p in parts], shares, sizes, float(np.square(g.mean(0)).sum())))
    assert ema.value == pytest.approx(21.0, rel=0.1)


def test_a_noise_free_gradient_has_noise_scale_zero_and_pure_noise_a_huge_one():
    rng = np.random.default_rng(3)
    ema_exact, ema_noise = NoiseScaleEMA(0.99), NoiseScaleEMA(0.99)
    for _ in range(500):
        same = [2.0, 2.0]  # every part sees the same gradient: no noise
        ema_exact.update(partition_estimate(same, [0.5, 0.5], [8, 8], big_sq=2.0))
        g = regression_gradients(rng, np.full(D, 0.02), 16)  # |δ|² = 0.004: B_simple ~ 2500 >> 16
        ema_noise.update(
            partition_estimate(
                [float(np.square(g[:8].mean(0)).sum()), float(np.square(g[8:].mean(0)).sum())],
                [0.5, 0.5],
                [8, 8],
                float(np.square(g.mean(0)).sum()),
            )
        )
    assert ema_exact.value == 0.0
    assert not ema_noise.value < 300  # NaN (|G|² not resolved) or large


def test_micro_batch_probe_on_torch_backward_recovers_the_noise_scale_and_keeps_the_gradient():
    """The probe around real backward passes: each micro-batch's loss carries the whole batch's
    normaliser (as in the learner); the accumulated gradient is the plain one, bit for bit."""
    torch.manual_seed(0)
    w_star = torch.randn(D, dtype=torch.float64)
    w = torch.nn.Parameter(w_star + torch.tensor(DELTA))
    plain = torch.nn.Parameter(w.detach().clone())
    ema = NoiseScaleEMA(decay=0.999)
    big_b, micro = 48, 16
    for _ in range(1000):
        x = torch.randn(big_b, D, dtype=torch.float64)
        y = x @ w_star + NOISE_SD * torch.randn(big_b, dtype=torch.float64)
        probe = MicroBatchGradients([w])
        w.grad = plain.grad = None
        for a in range(0, big_b, micro):
            xs, ys = x[a : a + micro], y[a : a + micro]
            probe.before()
            (0.5 * (xs @ w - ys).square().sum() / big_b).backward()
            probe.after(micro / big_b, micro)
            (0.5 * (xs @ plain - ys).square().sum() / big_b).backward()
        assert torch.equal(w.grad, plain.grad)
        ema.update(probe.estimate(float(w.grad.square().sum())))
    assert ema.value == pytest.approx(21.0, rel=0.1)


def test_consecutive_step_products_recover_the_noise_scale_of_linear_regression():
    """Independent batches: E[G_t · G_(t-1)] = |G|², and B (|G_t|² - G_t · G_(t-1)) averages to tr(Σ)."""
    from railgate.regime import NoiseScaleLog

    torch.manual_seed(1)
    w = torch.nn.Parameter(torch.tensor(DELTA))  # w* = 0
    previous, log, big_b = PreviousStepGradient(), NoiseScaleLog(), 32
    for step in range(3000):
        x = torch.randn(big_b, D, dtype=torch.float64)
        y = NOISE_SD * torch.randn(big_b, dtype=torch.float64)
        w.grad = None
        (0.5 * (x @ w - y).square().sum() / big_b).backward()
        dot = previous.dot_and_keep([w])
        if dot is not None:
            est = consecutive_estimate(float(w.grad.square().sum()), dot, big_b)
            log(
                step, {"learner/trace_sigma": est.trace, "learner/grad_dot_prev": dot, "learner/rollouts_trained": 32.0}
            )
    s = log.summary()
    assert s["noise_scale_grad_sq"] == pytest.approx(1.0, rel=0.1) and s["noise_scale_trace"] == pytest.approx(
        21.0, rel=0.1
    )
    assert s["noise_scale"] == pytest.approx(21.0, rel=0.1) and s["noise_scale_steps"] == 2999
    assert s["noise_scale_low"] < 21.0 < s["noise_scale_high"] < 1.2 * 21.0


def test_bad_partitions_are_refused():
    with pytest.raises(ValueError, match="need >= 2 parts"):
        partition_estimate([1.0], [1.0], [4], 1.0)
    with pytest.raises(ValueError, match="must all be > 0"):
        partition_estimate([1.0, 1.0], [0.0, 1.0], [4, 4], 1.0)
    with pytest.raises(ValueError, match="0 < b_small < b_big"):
        two_batch_estimate(1.0, 8, 1.0, 8)


# --- the torch learner -----------------------------------------------------------------------


def test_torch_learner_logs_the_noise_scale_and_its_update_is_bit_identical():
    model = tiny_llama()
    on, off = (
        make_learner(copy.deepcopy(model), micro_batch=3, lr=1e-2),
        make_learner(copy.deepcopy(model), micro_batch=3, lr=1e-2, noise_scale=False),
    )
    batches = [on_policy(on, random_groups(seed, sizes=(3, 3, 3, 3))) for seed in range(3)]
    for batch in batches:
        a, b = on.step(batch).metrics, off.step(batch).metrics
        assert a["learner/grad_norm"] == b["learner/grad_norm"] and a["learner/loss"] == b["learner/loss"]
        for name in ("grad_sq_small", "grad_sq_big", "grad_sq_micro", "trace_sigma_micro", "noise_batch_small"):
            assert math.isfinite(a[f"learner/{name}"]) and f"learner/{name}" not in b
        assert ("learner/grad_dot_prev" in a) == (batch is not batches[0]) and "learner/grad_dot_prev" not in b
        # defined once the averaged |G|² is positive (a random tiny model's batch is mostly noise)
        for key, ema in (("learner/noise_scale", on.noise), ("learner/noise_scale_micro", on.noise_micro)):
            assert (key in a) == (ema.steps > 0 and ema.grad_sq > 0) and key not in b
        assert a["learner/grad_sq_big"] == pytest.approx(a["learner/grad_norm"] ** 2, rel=1e-6)
        assert a["learner/noise_batch_small"] == pytest.approx(3.0, rel=0.5)  # micro-batches of 3 rollouts
    assert all(torch.equal(v, off.weights()[k]) for k, v in on.weights().items())
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            on.state_dict()["optimizer"]["state"][0].values(), off.state_dict()["optimizer"]["state"][0].values()
        )
    )


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_identical_micro_batches_have_noise_scale_zero_in_the_learner(agg):
    """Four copies of one group, one per micro-batch: every micro-batch sees the batch's gradient."""
    learner = make_learner(micro_batch=2, loss_agg=agg)
    group = ([1, 5, 6], [([7, 8, 2], 1.0), ([9, 10, 11, 2], 0.0)])
    metrics = learner.step(on_policy(learner, [group] * 4)).metrics
    assert metrics["learner/noise_batch_small"] == pytest.approx(2.0)
    assert metrics["learner/grad_sq_micro"] == pytest.approx(metrics["learner/grad_sq_big"], rel=1e-4)
    assert metrics["learner/noise_scale_micro"] == pytest.approx(0.0, abs=1e-2)


@pytest.mark.parametrize("agg", ["seq_mean_token_mean", "seq_mean_token_sum"])
def test_sequence_mean_losses_get_a_noise_scale_too(agg):
    learner = make_learner(micro_batch=2, loss_agg=agg)
    metrics = learner.step(on_policy(learner, random_groups(4, sizes=(2, 2, 2)))).metrics
    assert math.isfinite(metrics["learner/noise_scale_micro"]) or metrics["learner/grad_sq_micro"] <= 0


def test_one_micro_batch_per_step_has_the_consecutive_step_estimate_only():
    learner = make_learner(micro_batch=128)
    metrics = learner.step(on_policy(learner, random_groups())).metrics
    assert not any(
        k in metrics for k in ("learner/noise_scale_micro", "learner/trace_sigma_micro", "learner/grad_dot_prev")
    )
    assert metrics["learner/grad_sq_big"] > 0
    # the consecutive-step product needs no micro-batches: from the second step on
    second = learner.step(on_policy(learner, random_groups(1))).metrics
    assert "learner/grad_dot_prev" in second and "learner/trace_sigma" in second


def test_the_consecutive_step_product_is_the_product_of_the_two_gradients():
    learner = make_learner(lr=1e-2, micro_batch=3)
    first, second = on_policy(learner, random_groups(0)), on_policy(learner, random_groups(1))
    g1 = torch.cat([g.flatten() for g in learner.compute_gradients(first).values()])
    learner.step(first)
    g2 = torch.cat([g.flatten() for g in learner.compute_gradients(second).values()])
    metrics = learner.step(second).metrics
    assert metrics["learner/grad_dot_prev"] == pytest.approx(float(g1 @ g2), rel=1e-4)
    assert metrics["learner/grad_sq_big"] == pytest.approx(float(g2 @ g2), rel=1e-4)


def test_noise_scale_state_resumes_exactly():
    learner = make_learner(micro_batch=3, lr=1e-2)
    batches = [on_policy(learner, random_groups(seed, sizes=(3, 3, 3))) for seed in range(3)]
    for batch in batches[:2]:
        learner.step(batch)
    state = learner.state_dict()
    expected = learner.step(batches[2]).metrics
    resumed = make_learner(tiny_llama(seed=7), micro_batch=3, lr=1e-2)
    resumed.load_state_dict(state)
    got = resumed.step(batches[2]).metrics
    for key in ("learner/trace_sigma", "learner/grad_dot_prev", "learner/trace_sigma_micro"):
        assert got[key] == expected[key]
    assert resumed.noise.state_dict() == learner.noise.state_dict() and learner.noise.steps == 2  # from step 2 on
    assert resumed.noise_micro.state_dict() == learner.noise_micro.state_dict() and learner.noise_micro.steps == 3
