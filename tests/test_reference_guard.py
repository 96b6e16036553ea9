"""Issue 54: the reference screen acts on a calibrated likelihood only where the likelihood ranks
the pass rates the run observes (``ReferenceCalibration.informative``); ``bench replay``'s
``trl_default`` policy is ``GatedGRPOConfig``'s gate; its calibration table; the probing rule's
fit counts probed groups at their verdict and forecasts its own yield."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from gate_units import admit, closing, pool_of, snap, update

from controller.config import SaraConfig
from controller.gates.sara import SaraGate
from controller.probing import EXPLORE_EVERY, ProbingRule, fit_beta_binomial, probe_yield
from controller.reference import ReferenceScreen
from controller.reference_fit import ReferenceCalibration
from pipeline.store.grouplog import GroupLog, RecordedGroup
from railgate.replay.bench import ReplaySpec, gate_config, replay_log
from railgate.replay.render import table


def _calibration(informative: bool, n: int = 200, seed: int = 0) -> ReferenceCalibration:
    """Groups of 4 whose pass rate is sqrt(likelihood) (informative) or 0.1 whatever it is."""
    rng = np.random.default_rng(seed)
    fit = ReferenceCalibration(min_groups=32)
    for lp in rng.uniform(-8.0, -1.0, size=n):
        p = math.exp(lp / 2) if informative else 0.1
        fit.observe(float(lp), int(rng.binomial(4, p)), 4)
    return fit


def _screen(calibration: ReferenceCalibration) -> ReferenceScreen:
    return ReferenceScreen({}, lambda n: [], exact=False, strength=64, ahead=1, calibration=calibration)


def test_the_test_tells_an_informative_likelihood_from_a_flat_one():
    assert _calibration(informative=True).informative()
    for seed in range(5):
        assert not _calibration(informative=False, seed=seed).informative()
    constant = ReferenceCalibration(min_groups=32)
    for lp in np.linspace(-8.0, -1.0, 64):
        constant.observe(float(lp), 0, 4)  # nothing ever passes: no ranking to read
    assert constant.fitted and not constant.informative()


def test_an_uninformative_likelihood_skips_nothing_and_is_counted():
    screen = _screen(_calibration(informative=False))
    screen.update({p: math.log(q) for p, q in enumerate([1e-6, 1e-3, 0.05, 0.3])}, tokens=0)
    for p in range(4):
        opening = screen.opening(p, (1.0, 1.0), group_size=8)
        assert opening.prior == (1.0, 1.0)  # the gate's own prior, not the fitted map's
        assert not screen.skips(opening, limit=0.45)
    assert screen.metrics()["gate/reference_uninformative"] == 4


def test_an_informative_likelihood_skips_the_prompts_its_map_calls_hopeless():
    screen = _screen(_calibration(informative=True))
    screen.update({0: math.log(1e-6), 1: math.log(0.3)}, tokens=0)
    hopeless, middling = screen.opening(0, (1.0, 1.0), 8), screen.opening(1, (1.0, 1.0), 8)
    assert hopeless.prior != (1.0, 1.0)
    assert screen.skips(hopeless, limit=0.45) and not screen.skips(middling, limit=0.45)
    assert screen.metrics()["gate/reference_uninformative"] == 0


def _scored_log(informative: bool, n: int = 256, k: int = 16, seed: int = 0) -> GroupLog:
    """Hard prompts (pass rates piled near 0, as SmolLM2's): the likelihood tracks the rate, or not."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n):
        p = float(rng.beta(0.4, 6.0))
        lp = math.log(max(p, 1e-6)) * 3 if informative else float(rng.uniform(-30.0, -5.0))
        rewards = tuple(float(x) for x in rng.random(k) < p)
        groups.append(RecordedGroup.of(g, g, rewards, reference_logprob=lp))
    return GroupLog(tuple(groups), ("test",))


def test_trl_default_skips_nothing_where_the_likelihood_says_nothing():
    spec = ReplaySpec(gates=("uniform", "trl_default"), group_size=8, orders=1, resamples=50)
    flat = replay_log(_scored_log(informative=False, n=128), spec, progress=False)["gates"]["trl_default"]
    assert flat["skipped_mixed_share"] == 0.0
    assert flat["gate_metrics"]["gate/reference_uninformative"] > 0
    assert flat["gate_metrics"].get("gate/skip_reference", 0.0) == 0.0
    told = replay_log(_scored_log(informative=True, n=128), spec, progress=False)["gates"]["trl_default"]
    assert told["gate_metrics"].get("gate/skip_reference", 0.0) > 0  # the informative one does skip


def test_trl_default_is_gated_grpo_configs_gate():
    pytest.importorskip("trl")
    from railgate.trl.config import GatedGRPOConfig
    from railgate.trl.session import orchestrator_config

    for g in (8, 16):
        args = GatedGRPOConfig(
            output_dir="out", num_generations=g, per_device_train_batch_size=g, use_cpu=True, report_to=[]
        )
        cfg = gate_config("trl_default", g, 32, ())
        # bench replay caps HORA's groups for every gate (a section trl_default's SARA never reads)
        assert dataclasses.replace(cfg.gate, hora=args.gate_config().hora) == args.gate_config()
        assert cfg.replay.reference_exact is args.gate_reference_exact is False
        o = orchestrator_config(args)
        for field in ("max_async_steps", "max_concurrent_samples", "max_open_groups"):
            assert getattr(cfg.orchestrator, field) == getattr(o, field)


def test_the_calibration_table_reads_the_log():
    spec = ReplaySpec(gates=("uniform",), group_size=8, orders=1, resamples=50)
    told = replay_log(_scored_log(informative=True), spec, progress=False)
    flat = replay_log(_scored_log(informative=False), spec, progress=False)
    assert told["calibration"]["informative"] and told["calibration"]["rank_correlation"] > 0.5
    assert not flat["calibration"]["informative"] and abs(flat["calibration"]["rank_correlation"]) < 0.2
    assert told["calibration"]["auc_any_success"] > 0.8
    bins = told["calibration"]["bins"]
    assert len(bins) == 5 and sum(b["groups"] for b in bins) == 256
    observed = [b["observed_pass_rate"] for b in bins]
    assert observed == sorted(observed)  # the likelihood ranks the rates: bins climb
    text = table(told)
    assert "calibration (256 groups with a reference score)" in text and "calibrated: mixed" in text
    unscored = GroupLog(tuple(RecordedGroup.of(g, g, (1.0, 0.0, 0.0, 0.0)) for g in range(8)), ("test",))
    assert (
        replay_log(unscored, ReplaySpec(gates=("uniform",), orders=1, resamples=10), progress=False)["calibration"]
        is None
    )


def test_probed_groups_count_for_the_probing_rule_at_their_verdict():
    # A probed group committed waits for its step to ship; the rule must see it when it closes, as
    # it sees an abandoned one, or a hard run's fit holds only the abandons.
    config = SaraConfig(probe_when="pays", probe_fit_min_groups=2, probe_max_lost=1.0)
    gate = SaraGate(pool_of(4), group_size=8, config=config)
    assert gate.probing is not None
    for successes in (0, 4) * 8:  # whole groups of a run where probing pays: the licence
        gate.probing.observe(successes, 8, whole=True)
    plans = admit(gate, 4)
    assert [p.initial for p in plans] == [4] * 4
    for plan, probe in zip(plans, [(0, 0, 0, 0), (1, 0, 0, 0), (0, 0, 0, 0), (0, 1, 0, 0)]):
        last = snap(plan.group_id, plan.prompt, probe)
        update(gate, last)
        gate.on_closed(closing(last, committed=sum(probe) > 0), committed=sum(probe) > 0)
    assert sorted(list(gate.probing._groups)[16:]) == [(0, 4), (0, 4), (1, 4), (1, 4)]


def test_the_rules_forecast_is_its_choices_under_its_fit():
    rule = ProbingRule(group_size=8, probe_size=4, tau_commit=0.5, tau_abandon=0.45, min_groups=16)
    assert rule.forecast() is None
    rng = np.random.default_rng(0)
    for p in rng.beta(0.4, 10.0, size=64):  # hard: probing pays
        rule.observe(int(rng.binomial(8, p)), 8, whole=True)
    run = rule.run_prior()
    assert run is not None
    for _ in range(EXPLORE_EVERY - 1):  # the next choice would be the licence's exploring whole group
        assert rule.choose(run) == "probe"
    expected = probe_yield(run, 8, 4, 0.5, 0.45)
    got = rule.forecast()
    assert got is not None and got.per_rollout == pytest.approx(expected.per_rollout)
    assert rule.metrics()["gate/probing_forecast_per_1k"] == pytest.approx(1000 * expected.per_rollout)
    a, b = fit_beta_binomial(rule._groups)
    assert (a, b) == pytest.approx(run)


def test_a_fixed_prior_gates_forecast_follows_the_logs_rates_not_its_prior():
    spec = ReplaySpec(gates=("sara",), group_size=8, orders=1, resamples=50)
    hard = replay_log(_scored_log(informative=False, seed=1), spec, progress=False)["gates"]["sara"]
    replayed = hard["informative_per_1k_rollouts"]
    forecast = hard["forecast"]["per_1k_rollouts"]
    assert forecast < 60  # the uniform prior alone would say 93.7
    assert replayed[1] <= forecast <= replayed[2]
