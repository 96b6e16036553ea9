"""Whether probing pays (controller.probing): the yields against Monte Carlo of the real gate, the
run-wide fit, and SARA with ``probe_when: pays`` on populations of known pass rates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gate_harness import GateHarness, HarnessConfig
from gate_units import admit, kinds, pool_of, snap, update

from controller.config import SaraConfig
from controller.gates.sara import SaraGate
from controller.posterior import sara_expected_rollouts
from controller.probing import ProbingRule, empirical_probe, probe_yield, step_value, whole_yield


def _harness_run(gate: SaraGate, rates: dict[int, float], groups: int, open_groups: int = 512) -> GateHarness:
    cfg = HarnessConfig(
        batch_groups=64,
        steps=10_000,
        max_groups=groups,
        max_async_steps=10_000,
        max_open_groups=open_groups,
        learner_time=0.0,
    )
    harness = GateHarness(gate, rates, cfg).run()
    assert harness.stop_reason == "max_groups" and not harness.groups
    harness.check_invariants()
    return harness


@pytest.mark.parametrize(
    ("prior", "probe", "taus"),
    [
        ((1.0, 1.0), 4, (0.5, 0.45)),  # abandon iff the probe is all-same
        ((0.3, 0.4), 4, (0.5, 0.45)),  # rates piled near 0 and 1
        ((2.0, 6.0), 2, (0.6, 0.3)),  # a continue band: one more rollout at a time
    ],
)
def test_probe_yield_matches_the_real_gate_on_rates_drawn_from_the_prior(prior, probe, taus):
    n = 3000
    rng = np.random.default_rng(7)
    rates = {i: float(p) for i, p in enumerate(rng.beta(*prior, size=n))}
    config = SaraConfig(probe_size=probe, tau_commit=taus[0], tau_abandon=taus[1], prior=prior)
    stats = _harness_run(SaraGate(pool_of(n, seed=3), group_size=8, config=config), rates, n).stats
    expected = probe_yield(prior, 8, probe, *taus)
    rollouts, mixed = stats["rollouts"] / n, stats["effective"] / n
    # standard errors: a group costs between 1 and 8 rollouts; mixed is a Bernoulli per prompt
    assert abs(rollouts - expected.rollouts) < 4 * 3.5 / math.sqrt(n), (rollouts, expected)
    assert abs(mixed - expected.mixed) < 4 * math.sqrt(0.25 / n), (mixed, expected)
    assert abs(stats["shipped"] / n - expected.committed) < 4 * math.sqrt(0.25 / n)


def test_probe_yield_reduces_to_the_closed_form_at_one_rate():
    # A prior concentrated at p: SARA's "abandon iff the k-probe is all-same" closed form.
    for p in (0.1, 0.5, 0.8):
        y = probe_yield((p * 1e7, (1 - p) * 1e7), 8, 4, 0.5, 0.45, test_prior=(1.0, 1.0))
        assert math.isclose(y.rollouts, sara_expected_rollouts(p, 4, 8), rel_tol=1e-4)
        assert math.isclose(whole_yield((p * 1e7, (1 - p) * 1e7), 8).mixed, 1 - p**8 - (1 - p) ** 8, rel_tol=1e-4)


def test_the_rule_picks_the_option_monte_carlo_says_yields_more_mixed_groups_per_rollout():
    rng = np.random.default_rng(0)
    populations = {
        "equal 0.5": lambda n: np.full(n, 0.5),
        "equal 0.04": lambda n: np.full(n, 0.04),
        "equal 0.13": lambda n: np.full(n, 0.13),
        "half never solved": lambda n: np.where(np.arange(n) % 2 == 0, 0.0, 0.5),
        "piled at 0 and 1": lambda n: rng.beta(0.2, 0.2, size=n),
    }
    for name, draw in populations.items():
        rates = draw(4000)
        rule = ProbingRule(8, 4, 0.5, 0.45, window=256, min_groups=16)
        for p in rates[:256]:
            rule.observe(int(rng.binomial(8, p)), 8, whole=True)
        # Monte Carlo of both options on the same rates, SARA's test under the fitted prior
        prior = rule.run_prior()
        assert prior is not None
        draws = rng.random((len(rates), 8)) < rates[:, None]
        whole_mixed = np.mean(draws.any(1) & ~draws.all(1)) / 8
        probe_costs, probe_mixed = [], 0
        gate_says = SaraConfig(prior=prior)
        for row in draws:
            s = int(row[:4].sum())
            mixed_probe = 0 < s < 4
            if mixed_probe or _commits(s, 4 - s, prior, gate_says):
                probe_costs.append(8)
                probe_mixed += bool(row.any() and not row.all())
            else:
                probe_costs.append(4)
        probe_ratio = probe_mixed / sum(probe_costs)
        want = "whole" if whole_mixed >= probe_ratio else "probe"
        assert rule.choose(prior) == want, (name, prior, whole_mixed, probe_ratio)


def _commits(s: int, f: int, prior: tuple[float, float], config: SaraConfig) -> bool:
    gate = SaraGate(pool_of(1), group_size=8, config=config)
    (plan,) = admit(gate, 1)
    return ("commit", 0, 0) in kinds(update(gate, snap(0, plan.prompt, (1,) * s + (0,) * f)))


def test_step_limited_runs_price_steps_and_prefer_whole_groups():
    piled = (0.3, 0.3)
    whole, probe = whole_yield(piled, 8), probe_yield(piled, 8, 4, 0.5, 0.45)
    assert step_value(probe, math.inf) > step_value(whole, math.inf)  # more mixed groups per rollout
    assert step_value(probe, 0.1) < step_value(whole, 0.1)  # but every step costs more
    rule = ProbingRule(8, 4, 0.5, 0.45, min_groups=4, noise_groups=0.1)
    for s in (0, 8, 0, 8, 3, 0, 8, 0, 4):
        rule.observe(s, 8, whole=True)
    assert rule.choose(rule.run_prior()) == "whole"


def test_the_rule_forgets_what_the_policy_left_behind():
    rule = ProbingRule(8, 4, 0.5, 0.45, window=32, min_groups=8)
    for _ in range(32):
        rule.observe(4, 8, whole=True)
    assert rule.choose(rule.run_prior()) == "whole"
    for i in range(32):  # the policy moved: most prompts solved or unsolved, a quarter at one half
        rule.observe((0, 8, 0, 4)[i % 4], 8, whole=True)
    assert rule.choose(rule.run_prior()) == "probe"
    assert rule.metrics()["gate/probing_whole"] == 1 and rule.metrics()["gate/probing_probe"] == 1


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="noise_groups=-1"):
        ProbingRule(8, 4, 0.5, 0.45, noise_groups=-1)
    with pytest.raises(ValueError, match="probe_size=9"):
        probe_yield((1.0, 1.0), 8, 9, 0.5, 0.45)
    with pytest.raises(Exception, match="probe_when='sometimes'"):
        SaraConfig(probe_when="sometimes")  # type: ignore[arg-type]


def _pays(groups: int, rates: dict[int, float], max_lost: float = 0.1) -> tuple[GateHarness, SaraGate]:
    config = SaraConfig(probe_when="pays", probe_fit_min_groups=16, probe_max_lost=max_lost)
    gate = SaraGate(pool_of(len(rates), seed=1), group_size=8, config=config)
    return _harness_run(gate, rates, groups, open_groups=16), gate


def test_equal_middling_rates_train_on_almost_every_rollout():
    harness, gate = _pays(600, {i: 0.5 for i in range(200)})
    stats = harness.stats
    trained = stats["shipped"] * 8
    assert stats["rollouts"] <= 1.02 * trained, stats
    assert gate.metrics()["gate/probing_whole"] > 500


def _spent_by_parity(harness: GateHarness) -> dict[int, int]:
    """Rollouts spent on even and odd prompts."""
    spent, prompt_of = {0: 0, 1: 0}, {}
    for entry in harness.log:
        if entry[0] == "plan":
            prompt_of[entry[1]] = entry[2]
            spent[entry[2] % 2] += entry[4]
        elif entry[0] == "action" and entry[2] == "launch":
            spent[prompt_of[entry[3]] % 2] += entry[4]
    assert spent[0] + spent[1] == harness.stats["rollouts"]
    return spent


def test_prompts_that_are_never_solved_get_well_under_half_the_rollouts():
    # A probe of 4 abandons about 2 in 17 of the mixed rate-0.5 groups (all-fail or all-success),
    # which a cap of 20% allows
    rates = {i: 0.0 if i % 2 == 0 else 0.5 for i in range(200)}
    harness, gate = _pays(800, rates, max_lost=0.2)
    spent = _spent_by_parity(harness)
    assert spent[0] < 0.4 * (spent[0] + spent[1]), spent
    assert 0.08 < gate.metrics()["gate/probing_whole_lost"] < 0.2


def test_probing_that_would_abandon_too_many_mixed_groups_launches_whole_groups():
    # At rate 0.25 a probe of 4 is all-fail in about 3 of 10 mixed groups: past the default cap of 10%
    harness, gate = _pays(800, {i: 0.0 if i % 2 == 0 else 0.25 for i in range(200)})
    spent = _spent_by_parity(harness)
    assert abs(spent[0] - spent[1]) <= 0.02 * (spent[0] + spent[1]), spent  # whole groups for all
    assert gate.metrics()["gate/probing_licensed"] == 0.0


def test_the_licence_is_what_probing_whole_groups_would_have_done():
    # Monte Carlo: probe 4 of each recorded whole group in a random order; abandon all-same probes.
    rng = np.random.default_rng(3)
    rates = np.where(rng.random(400) < 0.6, rng.beta(0.3, 6.0, 400), rng.beta(4.0, 2.0, 400))
    successes = rng.binomial(8, rates)
    est = empirical_probe(successes, 8, 4)
    mixed = lost = rollouts = 0
    for _ in range(50):
        for s in successes:
            row = rng.permutation(np.arange(8) < s)
            same = row[:4].all() or not row[:4].any()
            rollouts += 4 if same else 8
            mixed += 0 < s < 8
            lost += same and 0 < s < 8
    assert math.isclose(est.lost, lost / mixed, rel_tol=0.03)
    assert math.isclose(est.probe.rollouts, rollouts / (50 * len(successes)), rel_tol=0.01)


def test_the_first_groups_are_launched_whole():
    harness, gate = _pays(40, {i: 0.0 if i % 2 == 0 else 0.5 for i in range(200)}, max_lost=1.0)
    launched = [entry for entry in harness.log if entry[0] == "plan"][:16]
    assert all(entry[4] == 8 for entry in launched), launched


def test_the_fit_and_the_counts_survive_a_checkpoint():
    harness, gate = _pays(100, {i: 0.5 for i in range(100)})
    restored = SaraGate(pool_of(100), group_size=8, config=gate.config)
    restored.load_state_dict(gate.state_dict())
    assert restored.probing is not None and gate.probing is not None
    assert restored.probing.run_prior() == gate.probing.run_prior()
    assert restored.metrics()["gate/probing_whole"] == gate.metrics()["gate/probing_whole"]
