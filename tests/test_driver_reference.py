"""GateDriver with SARA's reference prior: the caller's score of each prompt's reference
response sets the group's prior and may skip the prompt before any sample."""

from __future__ import annotations

import math

import pytest

from controller.driver import GateDriver, LifecycleError


def run(group, rewards, verdict=None):
    """Feed ``rewards`` to ``group`` as the gate asks for them (from ``verdict``, the verdict of its
    start, or from its start); the final verdict."""
    verdict = verdict or group.start()
    it = iter(rewards)
    while verdict.kind == "sample":
        verdict = group.report([next(it) for _ in range(verdict.n)])
    return verdict


def test_an_exact_reference_at_one_half_keeps_a_group_the_uniform_prior_drops():
    # All-fail probe of 4: with the uniform prior P_eff = 4/9 <= 0.45 (drop); a prompt the policy
    # answers right half the time (Beta(32, 32)) still has good odds of a mixed group (train).
    plain = GateDriver.sara(group_size=8, probe_size=4)
    scored = GateDriver.sara(group_size=8, probe_size=4, reference_prior=True, reference_exact=True)
    assert run(plain.open("p", prompt_id=0), [0.0] * 8).kind == "drop"
    group = scored.open("p", prompt_id=0, reference_logprob=math.log(0.5), reference_tokens=7)
    assert run(group, [0.0] * 4 + [1.0] * 4).kind == "train"
    assert group.launched == 8
    metrics = scored.metrics()
    assert metrics["gate/reference_scored"] == 1.0 and metrics["gate/reference_scored_tokens"] == 7.0


@pytest.mark.parametrize(
    "exact, q, skipped",
    [
        (True, 0.98, True),  # 1 - q^8 - (1-q)^8 = 0.15 <= 0.8
        (True, 0.5, False),
        (False, 0.99, True),  # lower bound: 1 - q^8 = 0.077 <= 0.8
        (False, 0.5, False),  # lower bound: 1 - q^8 = 0.996 > 0.8 (the prior stays the gate's own)
    ],
)
def test_skips_follow_the_prior_chance_of_a_mixed_group(exact, q, skipped):
    driver = GateDriver.sara(
        group_size=8, probe_size=4, reference_prior=True, reference_exact=exact, reference_skip=0.8
    )
    group = driver.open("p", prompt_id=3, reference_logprob=math.log(q))
    assert (group.start().kind == "skip") is skipped
    assert driver.metrics().get("gate/skip_reference", 0.0) == float(skipped)


def test_a_skipped_group_takes_no_rewards_and_is_not_trained():
    driver = GateDriver.sara(group_size=8, probe_size=4, reference_prior=True, reference_exact=True, reference_skip=0.8)
    group = driver.open("p", prompt_id=4, reference_logprob=0.0)
    assert group.start().kind == "skip" and group.launched == 0
    with pytest.raises(LifecycleError, match="ended"):
        group.report([1.0])
    with pytest.raises(LifecycleError, match="were not committed"):
        driver.step_done([group])
    nxt = driver.open("q", prompt_id=5, reference_logprob=math.log(0.5))
    assert nxt.start().kind == "sample" and nxt.group_id == group.group_id + 1


def test_an_unscored_prompt_starts_from_the_gates_own_prior():
    driver = GateDriver.sara(group_size=8, probe_size=4, reference_prior=True, reference_exact=True)
    assert run(driver.open("p", prompt_id=0), [0.0] * 8).kind == "drop"  # as without a reference
    assert driver.metrics()["gate/reference_unscored"] == 1.0


def test_a_score_without_the_reference_prior_is_refused():
    driver = GateDriver.sara(group_size=8, probe_size=4)
    with pytest.raises(ValueError, match="reference_prior=True"):
        driver.open("p", prompt_id=0, reference_logprob=-1.0)


@pytest.mark.parametrize(
    "q, rewards",
    [
        (0.5, [0.0] * 4 + [1.0] * 4),  # Beta(32, 32): even an all-fail probe commits -- certain, launched whole
        (0.3, [1.0] * 8),  # Beta(19.2, 44.8): an all-success probe still commits
    ],
)
def test_a_certain_commit_starts_whole_with_the_same_samples_and_verdict(q, rewards):
    options = dict(group_size=8, probe_size=4, reference_prior=True, reference_exact=True)
    probe_first = GateDriver.sara(**options)
    whole = GateDriver.sara(**options, whole_when_certain=True)
    a = probe_first.open("p", prompt_id=0, reference_logprob=math.log(q))
    b = whole.open("p", prompt_id=0, reference_logprob=math.log(q))
    first_a, first_b = a.start(), b.start()
    assert first_a.n == 4 and first_b.n == 8
    assert run(a, rewards, first_a).kind == run(b, rewards, first_b).kind == "train"
    assert a.launched == b.launched == 8 and a.rewards == b.rewards
    assert whole.metrics()["gate/launched_whole"] == 1.0 and "gate/launched_whole" not in probe_first.metrics()


def test_an_uncertain_group_keeps_its_probe():
    # The uniform prior (no score): an all-fail probe of 4 gives P_eff = 4/9 < 0.5 -- the probe decides.
    driver = GateDriver.sara(group_size=8, probe_size=4, whole_when_certain=True)
    group = driver.open("p", prompt_id=0)
    first = group.start()
    assert first.n == 4
    assert run(group, [0.0] * 8, first).kind == "drop" and group.launched == 4
