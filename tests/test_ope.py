"""controller.ope: unbiasedness and coverage on synthetic logs, properties, validation, and
agreement with vowpalwabbit's own IPS and DR policy evaluation (``--cb --eval``)."""

from __future__ import annotations

import dataclasses
import doctest

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from vowpalwabbit import pyvw

import controller.ope as ope
from controller.ope import Estimate, doubly_robust, ips, snips

# Two contexts (equally likely) x three actions; Bernoulli rewards with these means.
MEANS = np.array([[0.2, 0.5, 0.8], [0.7, 0.4, 0.1]])
# Deterministic target: the best action in each context, so its true value is 0.75.
TARGET_ACTION = np.array([2, 0])
TRUE_VALUE = 0.5 * 0.8 + 0.5 * 0.7
# A stochastic target policy and a context-dependent logging policy for the second scenario.
TARGET_PROBS = np.array([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1]])
LOGGING_PROBS = np.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
TRUE_STOCHASTIC_VALUE = 0.5 * float((TARGET_PROBS * MEANS).sum())


def draw_log(seed: int, n: int, logging: np.ndarray | None = None):
    """Contexts, logged actions and rewards; uniform logging over 3 actions by default."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 2, size=n)
    if logging is None:
        a = rng.integers(0, 3, size=n)
        mu = np.full(n, 1 / 3)
    else:
        a = (rng.random(n)[:, None] > np.cumsum(logging[x], axis=1)).sum(axis=1)
        mu = logging[x, a]
    r = (rng.random(n) < MEANS[x, a]).astype(float)
    return x, a, r, mu


def deterministic_estimates(seed: int, n: int, model: np.ndarray) -> dict[str, Estimate]:
    x, a, r, mu = draw_log(seed, n)
    pi = (a == TARGET_ACTION[x]).astype(float)
    return {
        "ips": ips(r, mu, pi),
        "snips": snips(r, mu, pi),
        "dr": doubly_robust(r, mu, pi, model[x, a], model[x, TARGET_ACTION[x]]),
    }


def test_doctests_run():
    result = doctest.testmod(ope)
    assert result.attempted >= 6 and result.failed == 0


# -- statistical behaviour on synthetic logs with a known truth -----------------------------

REPEATS, N = 400, 200
WRONG_MODEL = np.clip(1.0 - MEANS + 0.1, 0.0, 1.0)  # a deliberately bad reward model


@pytest.fixture(scope="module")
def repeated_draws() -> dict[str, list[Estimate]]:
    runs: dict[str, list[Estimate]] = {"ips": [], "snips": [], "dr": [], "dr_perfect": []}
    for seed in range(REPEATS):
        wrong = deterministic_estimates(seed, N, WRONG_MODEL)
        for key in ("ips", "snips", "dr"):
            runs[key].append(wrong[key])
        runs["dr_perfect"].append(deterministic_estimates(seed, N, MEANS)["dr"])
    return runs


@pytest.mark.parametrize("method", ["ips", "snips", "dr", "dr_perfect"])
def test_estimators_are_unbiased_over_many_seeds(repeated_draws, method):
    values = np.array([e.value for e in repeated_draws[method]])
    se_of_mean = values.std(ddof=1) / np.sqrt(values.size)
    assert abs(values.mean() - TRUE_VALUE) < 4 * se_of_mean, (values.mean(), se_of_mean)
    # The reported standard error matches the spread across repeated logs.
    reported = np.mean([e.stderr for e in repeated_draws[method]])
    assert reported == pytest.approx(values.std(ddof=1), rel=0.15)


@pytest.mark.parametrize("method", ["ips", "snips", "dr", "dr_perfect"])
def test_confidence_intervals_cover_at_nominal_rate(repeated_draws, method):
    covered = np.mean([e.lower <= TRUE_VALUE <= e.upper for e in repeated_draws[method]])
    # 95% nominal over 400 draws: binomial sd ~ 0.011.
    assert 0.91 <= covered <= 0.985, covered


def test_good_reward_model_reduces_variance(repeated_draws):
    ips_se = np.mean([e.stderr for e in repeated_draws["ips"]])
    dr_se = np.mean([e.stderr for e in repeated_draws["dr_perfect"]])
    assert dr_se < 0.75 * ips_se


def test_stochastic_target_with_nonuniform_logging():
    values = {"ips": [], "snips": [], "dr": []}
    model = np.full_like(MEANS, 0.5)
    for seed in range(300):
        x, a, r, mu = draw_log(1000 + seed, N, logging=LOGGING_PROBS)
        pi = TARGET_PROBS[x, a]
        values["ips"].append(ips(r, mu, pi).value)
        values["snips"].append(snips(r, mu, pi).value)
        q_target = (TARGET_PROBS[x] * model[x]).sum(axis=1)
        values["dr"].append(doubly_robust(r, mu, pi, model[x, a], q_target).value)
    for method, v in values.items():
        v = np.array(v)
        se = v.std(ddof=1) / np.sqrt(v.size)
        assert abs(v.mean() - TRUE_STOCHASTIC_VALUE) < 4 * se, method


def test_logging_policy_frequencies_are_what_draw_log_claims():
    x, a, _, mu = draw_log(5, 60_000, logging=LOGGING_PROBS)
    for ctx in range(2):
        freq = np.bincount(a[x == ctx], minlength=3) / np.sum(x == ctx)
        assert freq == pytest.approx(LOGGING_PROBS[ctx], abs=0.01)
    assert np.all(mu == LOGGING_PROBS[x, a])


# -- exact behaviour -----------------------------------------------------------------------


def test_interval_is_normal_with_requested_confidence():
    r = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    mu = np.full(6, 0.5)
    pi = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    e95, e80 = ips(r, mu, pi), ips(r, mu, pi, confidence=0.8)
    terms = pi / mu * r
    assert e95.value == pytest.approx(terms.mean())
    assert e95.stderr == pytest.approx(terms.std(ddof=1) / np.sqrt(6))
    assert e95.upper - e95.value == pytest.approx(1.959963984540054 * e95.stderr)
    assert e80.upper - e80.value == pytest.approx(1.2815515655446004 * e80.stderr)
    assert (e95.n, e95.method, e95.confidence) == (6, "ips", 0.95)


def test_snips_delta_method_stderr():
    r = np.array([1.0, 0.0, 1.0, 0.0])
    mu = np.array([0.5, 0.25, 0.5, 0.5])
    pi = np.array([1.0, 0.5, 0.25, 0.0])
    w = pi / mu
    e = snips(r, mu, pi)
    value = (w * r).sum() / w.sum()
    assert e.value == pytest.approx(value)
    expected = np.sqrt((w**2 * (r - value) ** 2).sum() * 4 / 3) / w.sum()
    assert e.stderr == pytest.approx(expected)


def test_clipping_caps_weights_and_biases_toward_zero():
    x, a, r, mu = draw_log(3, 500)
    pi = (a == TARGET_ACTION[x]).astype(float)
    clipped = ips(r, mu, pi, clip=2.0)
    assert clipped.value == pytest.approx(ips(r, mu, pi).value * 2.0 / 3.0)
    # SNIPS is invariant to a common rescaling of every weight, which clipping is here.
    assert snips(r, mu, pi, clip=2.0).value == pytest.approx(snips(r, mu, pi).value)
    assert ips(r, mu, pi, clip=10.0).value == ips(r, mu, pi).value


def test_single_record_has_unbounded_interval():
    e = ips([1.0], [0.5], [1.0])
    assert e.value == 2.0 and e.stderr == np.inf and e.lower == -np.inf and e.upper == np.inf


def test_estimate_is_frozen():
    e = ips([1.0, 0.0], [0.5, 0.5], [1.0, 1.0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.value = 3.0  # type: ignore[misc]


# -- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call,match",
    [
        (
            lambda: ips([1.0, 0.0, 1.0], [0.5, 0.0, 0.5], [1, 1, 1]),
            r"logged_propensities\[1\]=0.0 is not positive .*drop those records or clip",
        ),
        (lambda: snips([1.0, 0.0], [-0.2, 0.5], [1, 1]), r"logged_propensities\[0\]=-0.2"),
        (lambda: ips([1.0, np.nan], [0.5, 0.5], [1, 1]), r"rewards\[1\]=nan is not finite"),
        (lambda: ips([1.0, 1.0], [0.5, np.inf], [1, 1]), r"logged_propensities\[1\]=inf"),
        (lambda: ips([1.0, 1.0], [0.5, 1.5], [1, 1]), r"logged_propensities\[1\]=1.5 is not a"),
        (lambda: ips([1.0, 1.0], [0.5, 0.5], [1, -1]), r"target_propensities\[1\]=-1.0"),
        (lambda: ips([1.0, 1.0, 0.0], [0.5, 0.5], [1, 1]), "logged_propensities has 2 entries but rewards has 3"),
        (lambda: ips([], [], []), "no records"),
        (lambda: ips([[1.0]], [[0.5]], [[1.0]]), "one-dimensional"),
        (lambda: ips([1.0], [0.5], [1.0], confidence=1.0), "confidence=1.0"),
        (lambda: ips([1.0], [0.5], [1.0], clip=0.0), "clip=0.0"),
        (lambda: snips([1.0, 1.0], [0.5, 0.5], [0.0, 0.0]), "SNIPS is undefined"),
        (
            lambda: doubly_robust([1.0, 1.0], [0.5, 0.5], [1, 1], [0.5], [0.5, 0.5]),
            "predicted_logged has 1 entries but rewards has 2",
        ),
        (
            lambda: doubly_robust([1.0, 1.0], [0.5, 0.5], [1, 1], [0.5, 0.5], [0.5, np.nan]),
            r"predicted_target\[1\]=nan",
        ),
    ],
)
def test_invalid_inputs_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- properties ----------------------------------------------------------------------------

records = st.integers(min_value=2, max_value=40)
unit = st.floats(min_value=0.0, max_value=1.0)
positive = st.floats(min_value=0.01, max_value=1.0)


def vectors(n, elements):
    return hnp.arrays(np.float64, n, elements=elements)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=records)
def test_on_policy_ips_is_the_mean_reward(data, n):
    r = data.draw(vectors(n, st.floats(-5, 5)))
    mu = data.draw(vectors(n, positive))
    assert ips(r, mu, mu).value == pytest.approx(r.mean(), abs=1e-12)
    assert snips(r, mu, mu).value == pytest.approx(r.mean(), abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=records, scale=st.floats(0.05, 1.0))
def test_snips_ignores_a_common_scale_of_the_target(data, n, scale):
    r = data.draw(vectors(n, unit))
    mu = data.draw(vectors(n, positive))
    pi = data.draw(vectors(n, st.floats(0.01, 1.0)))
    a, b = snips(r, mu, pi), snips(r, mu, pi * scale)
    assert a.value == pytest.approx(b.value, rel=1e-9, abs=1e-12)
    assert a.stderr == pytest.approx(b.stderr, rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=records, confidence=st.floats(0.5, 0.99))
def test_doubly_robust_reductions_and_interval_order(data, n, confidence):
    r = data.draw(vectors(n, unit))
    mu = data.draw(vectors(n, positive))
    pi = data.draw(vectors(n, unit))
    q_target = data.draw(vectors(n, unit))
    zeros = np.zeros(n)
    dr0, base = doubly_robust(r, mu, pi, zeros, zeros), ips(r, mu, pi)
    assert dr0.value == pytest.approx(base.value) and dr0.stderr == pytest.approx(base.stderr)
    # A reward model that is exact on the logged actions leaves only the direct-method term.
    assert doubly_robust(r, mu, pi, r, q_target).value == pytest.approx(q_target.mean())
    for est in (ips(r, mu, pi, confidence=confidence), snips(r, mu, pi + 0.01 * (pi == 0))):
        assert est.lower <= est.value <= est.upper
    wide, narrow = ips(r, mu, pi, confidence=0.99), ips(r, mu, pi, confidence=0.5)
    assert wide.upper - wide.lower >= narrow.upper - narrow.lower


# -- agreement with vowpalwabbit -----------------------------------------------------------
# VW's `--cb K --eval` reads lines "<policy action> <logged action>:<cost>:<prob> | feats" and
# adds, per line, the IPS or DR estimate of the policy action's cost to its running loss
# (cb_algs.cc / cb_algs.h get_cost_estimate): IPS (c / p) 1[a_pol = a_log];
# DR q(x, a_pol) + 1[a_pol = a_log] (c - q(x, a_pol)) / p, with q VW's own cost regressor.
# Its mean loss over the log is therefore IPS or DR of the cost column for a deterministic
# policy. VW trains q on the log as it goes; to compare DR with fixed, known predictions we
# freeze a trained regressor (learning rate 0) and read q(x, a) off probe lines whose policy
# action differs from the logged one (their DR term is exactly q(x, a_pol)).


def _vw_line(policy_action, logged_action, cost, prob, context):
    return f"{policy_action + 1} {logged_action + 1}:{float(cost)!r}:{float(prob)!r} | c{context}"


def _vw_mean_loss(workspace, lines):
    loss0, n0 = workspace.get_sum_loss(), workspace.get_weighted_examples()
    for line in lines:
        workspace.learn(line)
    return (workspace.get_sum_loss() - loss0) / (workspace.get_weighted_examples() - n0)


def test_ips_matches_vowpalwabbit_cb_eval():
    x, a, r, mu = draw_log(11, 3000, logging=LOGGING_PROBS)
    cost = 1.0 - r
    policy = TARGET_ACTION[x]
    vw = pyvw.Workspace("--cb 3 --eval --cb_type ips --quiet")
    try:
        vw_value = _vw_mean_loss(vw, map(_vw_line, policy, a, cost, mu, x))
    finally:
        vw.finish()
    ours = ips(cost, mu, (a == policy).astype(float)).value
    assert vw_value == pytest.approx(ours, rel=1e-5)  # VW accumulates in float32


def test_doubly_robust_matches_vowpalwabbit_cb_eval(tmp_path):
    model_path = tmp_path / "cb_dr.vw"
    # 1) Train VW's DR cost regressor on one log (legacy cb stack, as --eval uses).
    x, a, r, mu = draw_log(21, 2000, logging=LOGGING_PROBS)
    trainer = pyvw.Workspace(f"--cb 3 --cb_type dr --cb_force_legacy --quiet -f {model_path}")
    try:
        for xi, ai, ri, mi in zip(x, a, r, mu):
            trainer.learn(_vw_line(ai, ai, 1.0 - ri, mi, xi).split(" ", 1)[1])
    finally:
        trainer.finish()
    evaluator = pyvw.Workspace(f"--eval --cb_type dr -l 0 -i {model_path} --quiet")
    try:
        # 2) Read q(x, a) off probe lines (policy action != logged action), twice, to check
        #    the learning rate of 0 really froze it.
        def probe(offset, cost, prob):
            q = np.zeros((2, 3))
            for ctx in range(2):
                for act in range(3):
                    line = _vw_line(act, (act + offset) % 3, cost, prob, ctx)
                    q[ctx, act] = _vw_mean_loss(evaluator, [line])
            return q

        q = probe(1, 0.5, 0.5)
        assert np.allclose(probe(2, 1.0, 0.2), q, atol=1e-7)
        assert np.ptp(q) > 0.05  # a real, non-constant regressor
        # 3) Evaluate a fresh log with it and compare.
        x, a, r, mu = draw_log(22, 3000, logging=LOGGING_PROBS)
        cost, policy = 1.0 - r, TARGET_ACTION[x]
        vw_value = _vw_mean_loss(evaluator, map(_vw_line, policy, a, cost, mu, x))
    finally:
        evaluator.finish()
    ours = doubly_robust(cost, mu, (a == policy).astype(float), q[x, a], q[x, policy]).value
    assert vw_value == pytest.approx(ours, rel=1e-5)
    # And DR with VW's (wrong) regressor still estimates the policy's true cost.
    assert abs(ours - (1.0 - TRUE_VALUE)) < 0.05
