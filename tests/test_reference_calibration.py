"""The reference prior that calibrates itself (controller.reference_fit): the fit of pass rate =
likelihood^gamma, and SARA's screen using it once fitted, with the gate reporting its groups."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gate_harness import GateHarness, HarnessConfig
from gate_units import admit, closing, pool_of, snap, update

from controller.config import SaraConfig
from controller.gates.sara import SaraGate
from controller.reference import ReferenceScreen
from controller.reference_fit import ReferenceCalibration


def _observed(gamma: float, n: int = 300, seed: int = 0, kappa: float | None = None) -> ReferenceCalibration:
    rng = np.random.default_rng(seed)
    fit = ReferenceCalibration(min_groups=16)
    for lp in rng.uniform(-8.0, 0.0, size=n):
        p = math.exp(gamma * lp)
        if kappa is not None:
            p = rng.beta(kappa * p + 1e-9, kappa * (1 - p) + 1e-9)
        fit.observe(float(lp), int(rng.binomial(4, p)), 4)
    return fit


def _screened_run(
    gate: SaraGate, screen: ReferenceScreen, rates: dict[int, float], logprobs: dict[int, float], steps: int
) -> GateHarness:
    """A harness run of ``gate`` with ``screen`` attached, scoring the prompts it wants (from
    ``logprobs``) before every admission, as the learner does after each step."""
    gate.attach_reference(screen)
    cfg = HarnessConfig(batch_groups=8, steps=steps, max_async_steps=1, learner_time=0.0, max_open_groups=16)
    harness = GateHarness(gate, rates, cfg)
    original = gate.admit

    def admit_scored(group_ids, step):
        screen.update({p.prompt_id: logprobs[p.prompt_id] for p in screen.wanted()}, tokens=0)
        return original(group_ids, step)

    gate.admit = admit_scored  # type: ignore[method-assign]
    return harness.run()


def test_an_exact_reference_fits_gamma_one_and_a_lifted_one_below():
    assert _observed(1.0).gamma() == pytest.approx(1.0, abs=0.1)
    assert _observed(0.3).gamma() == pytest.approx(0.3, abs=0.06)
    assert _observed(1.0).kappa() > 20  # the likelihood is the rate: worth many rollouts


def test_a_noisy_map_gets_a_weak_prior():
    noisy = _observed(0.5, kappa=2.0)
    assert noisy.kappa() < 10
    assert _observed(0.5).kappa() > 5 * noisy.kappa()


def test_the_fit_follows_the_policy_through_its_window():
    fit = ReferenceCalibration(window=64, min_groups=16)
    rng = np.random.default_rng(1)
    for lp in rng.uniform(-6, 0, size=64):
        fit.observe(float(lp), int(rng.binomial(4, math.exp(lp))), 4)
    assert fit.gamma() == pytest.approx(1.0, abs=0.2)
    for lp in rng.uniform(-6, 0, size=64):  # other answers start to pay
        fit.observe(float(lp), int(rng.binomial(4, math.exp(0.3 * lp))), 4)
    assert fit.gamma() == pytest.approx(0.3, abs=0.1)


def test_the_screen_is_a_lower_bound_until_fitted_then_uses_the_calibrated_prior():
    calibration = ReferenceCalibration(min_groups=16)
    screen = ReferenceScreen(
        {0: (1,), 1: (1,)}, lambda n: [], exact=False, strength=64, ahead=2, calibration=calibration
    )
    screen.update({0: math.log(0.01)}, tokens=0)
    before = screen.opening(0, (1.0, 1.0), 8)
    assert before.prior == (1.0, 1.0) and before.logprob == pytest.approx(math.log(0.01))
    rng = np.random.default_rng(2)
    for lp in rng.uniform(-8, 0, size=100):
        screen.observe(float(lp), int(rng.binomial(4, math.exp(0.25 * lp))), 4)
    screen.update({0: math.log(0.01)}, tokens=0)
    after = screen.opening(0, (1.0, 1.0), 8)
    a, b = after.prior
    assert a / (a + b) == pytest.approx(0.01**0.25, abs=0.06)  # about 0.32, not the likelihood's 0.01
    assert after.mixed == pytest.approx(1 - 0.316**8 - 0.684**8, abs=0.1)
    assert screen.metrics()["gate/reference_gamma"] == pytest.approx(0.25, abs=0.06)


def test_an_exact_screen_ignores_a_calibration():
    screen = ReferenceScreen(
        {0: (1,)}, lambda n: [], exact=True, strength=64, ahead=1, calibration=ReferenceCalibration()
    )
    assert screen.calibration is None


def test_sara_reports_each_scored_groups_probe_to_the_calibration():
    config = SaraConfig(reference_prior=True, reference_calibrate=True)
    gate = SaraGate(pool_of(2), group_size=8, config=config)
    screen = ReferenceScreen(
        {0: (1,), 1: (1,)},
        gate.source.peek,
        exact=False,
        strength=64,
        ahead=2,
        calibration=ReferenceCalibration(min_groups=2),
    )
    screen.update({0: math.log(0.2), 1: math.log(0.5)}, tokens=0)
    gate.attach_reference(screen)
    plans = admit(gate, 2)
    for plan, probe in zip(plans, [(0, 0, 0, 0), (1, 0, 1, 0)]):
        last = snap(plan.group_id, plan.prompt, probe)
        update(gate, last)
        gate.on_closed(closing(last, sum(probe) > 0), committed=sum(probe) > 0)
    assert screen.calibration is not None and screen.calibration.fitted
    state = gate.state_dict()
    restored = SaraGate(pool_of(2), group_size=8, config=config)
    restored.attach_reference(
        ReferenceScreen(
            {}, restored.source.peek, exact=False, strength=64, ahead=2, calibration=ReferenceCalibration(min_groups=2)
        )
    )
    restored.load_state_dict(state)
    assert restored.reference is not None and restored.reference.calibration is not None
    assert restored.reference.calibration.gamma() == pytest.approx(screen.calibration.gamma())


def test_a_calibrated_lower_bound_skips_saturated_prompts_a_bound_alone_lets_through():
    # Pass rates are likelihood^0.1: a likelihood of 0.5 passes 93% of the time, so its group is
    # all-correct more often than not. The bound (1 - q^8) skips only q >= 0.93; the calibrated
    # screen learns to skip every q >= 0.48 too.
    n = 400
    rng = np.random.default_rng(3)
    logprobs = {i: float(lp) for i, lp in enumerate(rng.uniform(-4.0, 0.0, size=n))}
    rates = {i: math.exp(0.1 * lp) for i, lp in logprobs.items()}

    def run(calibrate: bool) -> GateHarness:
        config = SaraConfig(reference_prior=True, reference_calibrate=calibrate, reference_skip=0.45)
        gate = SaraGate(pool_of(n, seed=4), group_size=8, config=config)
        screen = ReferenceScreen(
            {i: (1,) for i in range(n)},
            gate.source.peek,
            exact=False,
            strength=64,
            ahead=n,
            calibration=ReferenceCalibration(min_groups=32) if calibrate else None,
        )
        return _screened_run(gate, screen, rates, logprobs, steps=40)

    bound, calibrated = run(False), run(True)
    per_shipped = {
        name: h.stats["rollouts"] / h.stats["shipped"] for name, h in (("bound", bound), ("cal", calibrated))
    }
    effective = {
        name: h.stats["effective"] / h.stats["rollouts"] for name, h in (("bound", bound), ("cal", calibrated))
    }
    assert (
        calibrated.gate.metrics()["gate/skip_reference"] > 2 * bound.gate.metrics().get("gate/skip_reference", 0) + 10
    )
    assert effective["cal"] > effective["bound"], (effective, per_shipped)


def _skips_on(rates: dict[int, float], share: float) -> tuple[float, GateHarness]:
    """Share of the prompts SARA's exact reference screen (skip 0.8) skipped in a harness run over
    prompts whose likelihood is their pass rate."""
    n = len(rates)
    config = SaraConfig(reference_prior=True, reference_skip=0.8, reference_skip_share=share)
    gate = SaraGate(pool_of(n, seed=4), group_size=8, config=config)
    screen = ReferenceScreen({i: (1,) for i in range(n)}, gate.source.peek, exact=True, strength=64, ahead=n)
    harness = _screened_run(gate, screen, rates, {i: math.log(r) for i, r in rates.items()}, steps=20)
    skipped = gate.metrics().get("gate/skip_reference", 0.0)
    return skipped / (skipped + harness.stats["opened"]), harness


def test_a_skip_share_keeps_a_hard_start_from_skipping_nearly_every_prompt():
    rng = np.random.default_rng(5)
    hard = {i: float(r) for i, r in enumerate(rng.uniform(0.02, 0.06, size=600))}  # every group ~ 0.3 mixed
    uncapped, _ = _skips_on(hard, 1.0)
    capped, harness = _skips_on(hard, 0.5)
    assert uncapped > 0.9  # every chance is under 0.8: the limit alone skips almost all
    assert capped < 0.6 and harness.stats["shipped"] > 0
    spread = {i: float(r) for i, r in enumerate(rng.uniform(0.0, 1.0, size=600))}
    spread_uncapped, _ = _skips_on(spread, 1.0)
    spread_capped, _ = _skips_on(spread, 0.5)
    assert 0.3 < spread_capped <= spread_uncapped  # rates that spread still skip the saturated ones
