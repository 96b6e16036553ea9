"""SARA's confident pilot (``gate.sara.confident_pilot``): a group whose agreeing rollouts the
policy wrote with near certainty is abandoned before the rest of its probe is spent."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from gate_units import admit, kinds, pool_of, snap, update

from controller.config import SaraConfig
from controller.gates.sara import SaraGate
from controller.posterior import mixed_bound
from pipeline.config.build import ConfigError
from pipeline.core.group import GroupRun
from pipeline.types import FinishReason, Prompt, SampleFinished, SampleRequest, SamplingParams, ScoredSample


def test_the_bound_holds_for_any_response_distribution_and_is_tight_for_two_responses():
    rng = random.Random(0)
    for _ in range(500):
        # A policy's distribution over six responses, each right or wrong.
        weights = [rng.random() ** 3 for _ in range(6)]
        probs = [w / sum(weights) for w in weights]
        rewards = [rng.random() < 0.5 for _ in range(6)]
        for _i, (q, r) in enumerate(zip(probs, rewards)):
            same = sum(p for p, other in zip(probs, rewards) if other == r)
            for n in (1, 4, 7):
                # The group is mixed iff one of the n other rollouts earns the other reward.
                assert 1 - same**n <= mixed_bound(math.log(q), n) + 1e-12
    # Two responses, one right and one wrong: the bound is the exact chance.
    q = 0.9
    assert mixed_bound(math.log(q), 7) == pytest.approx(1 - q**7)
    assert mixed_bound(math.nan, 7) == 1.0 and mixed_bound(-3.0, 0) == 0.0
    with pytest.raises(ValueError, match="logprob_sum=0.5 must be <= 0"):
        mixed_bound(0.5, 3)
    with pytest.raises(ValueError, match="remaining=-1"):
        mixed_bound(-1.0, -1)


def confident(group_id, prompt, rewards, logprob_sums, origins=None, in_flight=0):
    """A snapshot whose rollouts carry their summed log-probs (and origins: -1, fresh)."""
    s = snap(group_id, prompt, rewards, in_flight=in_flight)
    return dataclasses.replace(
        s, logprob_sums=tuple(logprob_sums), origins=tuple(origins) if origins is not None else (-1,) * len(rewards)
    )


def test_a_pilot_comes_first_and_a_near_certain_one_settles_the_group():
    gate = SaraGate(pool_of(16), group_size=8, config=SaraConfig(confident_pilot=True))
    plans = admit(gate, 3)
    assert [p.initial for p in plans] == [1, 1, 1]  # the pilot, not the probe of 4
    sure, unsure, mixed = plans
    # The policy writes the pilot's response 99% of the time: P(mixed) <= 1 - 0.99^7 = 0.068.
    out = update(gate, confident(sure.group_id, sure.prompt, (1,), [math.log(0.99)]))
    assert kinds(out) == [("abandon", sure.group_id, 0)] and "P(mixed) <= 0.068" in out[0].reason
    # A pilot the policy wrote half the time says little: the rest of the probe follows.
    out = update(gate, confident(unsure.group_id, unsure.prompt, (1,), [math.log(0.5)]))
    assert kinds(out) == [("launch", unsure.group_id, 3)] and out[0].reason == "sara probe after the pilot"
    # ... and the probe then decides as published SARA does: all four agree -> abandon.
    lps = [math.log(0.5)] * 4
    assert kinds(update(gate, confident(unsure.group_id, unsure.prompt, (1, 1, 1, 1), lps)))[0][0] == "abandon"
    # A mixed group is never abandoned, however sure its rollouts were.
    update(gate, confident(mixed.group_id, mixed.prompt, (0,), [math.log(0.4)]))
    out = update(gate, confident(mixed.group_id, mixed.prompt, (0, 1), [math.log(0.4), math.log(0.999)], in_flight=2))
    assert "abandon" not in [k for k, _, _ in kinds(out)]
    assert gate.metrics()["gate/abandon_confident"] == 1


def test_confident_max_mixed_sets_how_sure_a_pilot_must_be():
    strict = SaraGate(pool_of(8), group_size=8, config=SaraConfig(confident_pilot=True, confident_max_mixed=0.1))
    loose = SaraGate(pool_of(8), group_size=8, config=SaraConfig(confident_pilot=True))
    for gate, verdict in ((strict, "launch"), (loose, "abandon")):
        plan = admit(gate, 1)[0]  # q = 0.95: P(mixed) <= 1 - 0.95^7 = 0.30
        out = update(gate, confident(plan.group_id, plan.prompt, (0,), [math.log(0.95)]))
        assert [k for k, _, _ in kinds(out)] == [verdict]
    with pytest.raises(ConfigError, match="confident_max_mixed=1.0 must be in"):
        SaraConfig(confident_max_mixed=1.0)


def test_only_fresh_rollouts_with_log_probs_count():
    """A branched or re-temperatured rollout (an intervention's) says nothing about a fresh
    sample; an engine that reported no log-probs gives no bound."""
    gate = SaraGate(pool_of(8), group_size=8, config=SaraConfig(confident_pilot=True))
    a, b = admit(gate, 2)
    sure = math.log(0.999)
    out = update(gate, confident(a.group_id, a.prompt, (0,), [sure], origins=[7]))
    assert [k for k, _, _ in kinds(out)] == ["launch"]
    out = update(gate, confident(b.group_id, b.prompt, (0,), [math.nan]))
    assert [k for k, _, _ in kinds(out)] == ["launch"]
    assert gate.confident_bound(confident(b.group_id, b.prompt, (0, 0), [math.nan, sure])) < 0.01


def test_off_by_default_and_the_published_probe_is_unchanged():
    gate = SaraGate(pool_of(4), group_size=8)
    plan = admit(gate, 1)[0]
    assert plan.initial == 4
    out = update(gate, confident(plan.group_id, plan.prompt, (1,), [0.0], in_flight=3))
    assert out == []  # a certain rollout, but the option is off: the probe goes on


def test_group_snapshots_carry_each_rollouts_summed_log_probs():
    prompt = Prompt(0, "p", (1,))
    group = GroupRun(0, prompt, target_size=8, opened_step=0)
    for i, lps in enumerate([(-0.5, -0.25), ()]):
        request = SampleRequest(f"r{i}", 0, i, prompt, SamplingParams())
        done = SampleFinished(f"r{i}", (5,) * len(lps), lps, FinishReason.STOP, 0)
        group.add(ScoredSample(request, done, reward=1.0))
    sums = group.snapshot(0, in_flight=0).logprob_sums
    assert sums[0] == -0.75 and math.isnan(sums[1])


def test_settings_that_break_the_bound_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match="launch='eager'"):
        SaraConfig(confident_pilot=True, launch="eager")
    from railgate.config import load_config

    with pytest.raises(ConfigError, match="temperature 1 and top_p 1"):
        load_config(
            "configs/sim.yaml", ["gate.kind=sara", "gate.sara.confident_pilot=true", "orchestrator.temperature=0.7"]
        )
    cfg = load_config("configs/sim.yaml", ["gate.kind=sara", "gate.sara.confident_pilot=true"])
    assert cfg.gate.sara.confident_pilot
