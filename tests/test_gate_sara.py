"""SaraGate: verdicts at the thresholds, launch modes, carried prior, and the closed forms."""

from __future__ import annotations

import math

import pytest
from gate_harness import GateHarness, HarnessConfig
from gate_units import admit, closing, kinds, pool_of, snap, update

from controller.config import SaraConfig
from controller.gates.sara import SaraGate
from controller.posterior import effective_probability, sara_expected_rollouts, sara_false_abandonment
from controller.selectors.dps import DpsSelector
from pipeline.core.group import closing_from_state


def opened(gate: SaraGate, n: int = 1):
    """Admit n groups and return their prompts, numbering the groups 0..n-1 in order."""
    return [plan.prompt for plan in admit(gate, n, step=0)]


def test_all_same_probe_of_four_in_eight_is_four_ninths():
    assert math.isclose(effective_probability(0, 4, 8), 4 / 9)
    gate = SaraGate(pool_of(2), group_size=8, config=SaraConfig(tau_abandon=0.45))
    (prompt,) = opened(gate)
    assert kinds(update(gate, snap(0, prompt, (0, 0, 0, 0)))) == [("abandon", 0, 0)]


def test_just_above_four_ninths_continues_one_rollout_at_a_time():
    gate = SaraGate(pool_of(2), group_size=8, config=SaraConfig(tau_abandon=0.44))
    (prompt,) = opened(gate)
    assert kinds(update(gate, snap(0, prompt, (1, 1, 1, 1)))) == [("launch", 0, 1)]
    # 5 all-correct: P_eff = 3/9 <= 0.44
    assert kinds(update(gate, snap(0, prompt, (1, 1, 1, 1, 1)))) == [("abandon", 0, 0)]


def test_continue_band_ends_in_a_commit_when_the_group_turns_mixed():
    gate = SaraGate(pool_of(2), group_size=16, config=SaraConfig(tau_abandon=0.3, tau_commit=0.9))
    (prompt,) = opened(gate)
    assert kinds(update(gate, snap(0, prompt, (0, 0, 0, 0), target=16))) == [("launch", 0, 1)]
    assert kinds(update(gate, snap(0, prompt, (0, 0, 0, 0, 1), target=16))) == [("launch", 0, 11), ("commit", 0, 0)]


def test_mixed_probe_commits_and_launches_the_rest():
    gate = SaraGate(pool_of(2), group_size=8)
    (prompt,) = opened(gate)
    assert kinds(update(gate, snap(0, prompt, (1, 0, 0, 0)))) == [("launch", 0, 4), ("commit", 0, 0)]


def test_commit_threshold_applies_to_all_same_probes():
    gate = SaraGate(pool_of(2), group_size=8, config=SaraConfig(tau_commit=0.4, tau_abandon=0.1))
    (prompt,) = opened(gate)
    assert kinds(update(gate, snap(0, prompt, (0, 0, 0, 0)))) == [("launch", 0, 4), ("commit", 0, 0)]


def test_no_verdict_before_the_probe_is_in():
    gate = SaraGate(pool_of(2), group_size=8)
    (prompt,) = opened(gate)
    assert update(gate, snap(0, prompt, (0, 0, 0), in_flight=1)) == []


def test_failed_probe_samples_are_replaced():
    gate = SaraGate(pool_of(2), group_size=8)
    (prompt,) = opened(gate)
    assert kinds(update(gate, snap(0, prompt, (0, 1, 0), failed=1))) == [("launch", 0, 1)]
    assert kinds(update(gate, snap(0, prompt, (0,), failed=8))) == [("abandon", 0, 0)]


def test_eager_launches_the_whole_group_and_abandons_with_siblings_running():
    gate = SaraGate(pool_of(2), group_size=8, config=SaraConfig(launch="eager"))
    plans = admit(gate, 2, step=0)
    assert [(p.target_size, p.initial) for p in plans] == [(8, 8), (8, 8)]
    assert update(gate, snap(0, plans[0].prompt, (0, 0, 0), in_flight=5)) == []
    assert kinds(update(gate, snap(0, plans[0].prompt, (0, 0, 0, 0), in_flight=4))) == [("abandon", 0, 0)]
    # mixed after 4 with 4 running: commit, nothing more to launch
    assert kinds(update(gate, snap(1, plans[1].prompt, (0, 1, 0, 0), in_flight=4))) == [("commit", 1, 0)]


@pytest.mark.parametrize("launch", ["probe_first", "eager"])
def test_launch_modes_pay_differently(launch):
    p = {i: 0.1 + 0.8 * (i % 5) / 4 for i in range(400)}
    harness = GateHarness(
        SaraGate(pool_of(400), 8, config=SaraConfig(launch=launch)), p, HarnessConfig(batch_groups=16, steps=10)
    ).run()
    harness.check_invariants()
    if launch == "eager":
        assert harness.stats["aborted"] > 0  # siblings running when the group was abandoned
    else:
        assert harness.stats["aborted"] == 0


def test_carried_prior_abandons_a_known_hard_prompt_sooner():
    def gate(discount):
        return SaraGate(
            pool_of(1), group_size=8, config=SaraConfig(tau_abandon=0.35, tau_commit=0.5, history_discount=discount)
        )

    for discount, second_verdict in [(0.0, "launch"), (1.0, "abandon")]:
        g = gate(discount)
        (prompt,) = opened(g)
        assert kinds(update(g, snap(0, prompt, (0, 0, 0, 0)))) == [("launch", 0, 1)]  # 4/9 > 0.35
        last = snap(0, prompt, (0, 0, 0, 0, 0))
        assert kinds(update(g, last)) == [("abandon", 0, 0)]  # 3/9
        g.on_closed(closing(last), committed=False)
        (again,) = opened(g)  # the same prompt, carrying Beta(1, 6) when discount = 1
        assert update(g, snap(1, again, (0, 0, 0, 0)))[0].kind.value == second_verdict


def test_carried_prior_follows_discount_posterior():
    g = SaraGate(pool_of(1), group_size=8, config=SaraConfig(history_discount=0.5))
    (prompt,) = opened(g)
    update(g, last := snap(0, prompt, (0, 0, 0, 0)))
    g.on_closed(closing(last), committed=False)
    assert g._prior_of(prompt.prompt_id) == (1.0, 1.0 + 0.5 * 4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tau_abandon": 0.9, "tau_commit": 0.8}, "must be below gate.sara.tau_commit"),
        ({"tau_abandon": 0.5, "tau_commit": 0.5}, "must be below gate.sara.tau_commit"),
        ({"probe_size": 9}, "probe_size=9"),
        ({"probe_size": 0}, "probe_size=0"),
        ({"prior": (-1.0, 1.0)}, "positive Beta"),
        ({"history_discount": 1.5}, "history_discount"),
        ({"launch": "lazy"}, "probe_first"),
    ],
)
def test_bad_settings_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SaraGate(pool_of(2), group_size=8, config=SaraConfig(**kwargs))


def test_sara_on_dps_releases_and_learns_from_abandoned_probes():
    selector = DpsSelector(pool_of(3), seed=0, explore=0.0)
    gate = SaraGate(selector, group_size=8)
    plans = admit(gate, 3, step=0)
    assert len({p.prompt.prompt_id for p in plans}) == 3
    assert admit(gate, 1, step=0) == []  # every prompt has an open group
    first = plans[0].prompt
    update(gate, last := snap(0, first, (0, 0, 0, 0)))
    gate.on_closed(closing(last), committed=False)
    assert selector.belief(first.prompt_id)[0] > 0.9  # all wrong: unsolved
    assert [p.prompt.prompt_id for p in admit(gate, 1, step=0)] == [first.prompt_id]


def _closed_form_run(n: int, p: float, seed: int):
    gate = SaraGate(
        pool_of(n, seed=seed), group_size=8, config=SaraConfig(probe_size=4)
    )  # abandon iff the 4-probe is all-same
    cfg = HarnessConfig(
        batch_groups=256, steps=10_000, max_groups=n, max_async_steps=10_000, learner_time=0.0, seed=seed
    )
    harness = GateHarness(gate, {i: p for i in range(n)}, cfg).run()
    assert harness.stop_reason == "max_groups" and not harness.groups
    harness.check_invariants()
    rollouts = harness.stats["rollouts"] / n
    false_abandonment = harness.stats["false_abandoned"] / n
    # standard errors: rollouts per prompt are k or G; false abandonment is a Bernoulli
    mixed = 1 - p**4 - (1 - p) ** 4
    se_rollouts = 4 * math.sqrt(mixed * (1 - mixed) / n)
    fa = sara_false_abandonment(p, 4, 8)
    se_fa = math.sqrt(fa * (1 - fa) / n)
    assert abs(rollouts - sara_expected_rollouts(p, 4, 8)) < 4 * se_rollouts, (
        rollouts,
        sara_expected_rollouts(p, 4, 8),
    )
    assert abs(false_abandonment - fa) < 4 * se_fa, (false_abandonment, fa)


def test_closed_forms_monte_carlo_small():
    _closed_form_run(3000, 0.3, seed=1)


@pytest.mark.slow
def test_closed_forms_monte_carlo_20k_prompts():
    _closed_form_run(20_000, 0.3, seed=2)


def test_a_checkpoint_from_before_admission_ids_loads_and_resumes():
    """Earlier releases numbered a group at its first update and kept the plans of groups that
    had not reported in a "book"; such a state loads, and a resume closes those groups. Their
    tracker checkpoint kept no closing snapshots (only the open ids), and a gate keeps no counts
    of its own: what the reported group saw before the checkpoint is not carried."""
    gate = SaraGate(pool_of(4), group_size=8, config=SaraConfig(history_discount=1.0))
    first, second = admit(gate, 2)
    update(gate, snap(first.group_id, first.prompt, (0, 0, 0)))
    old = {
        "source": gate.state_dict()["source"],
        "verdicts": {},
        "groups": {"0": {"prompt_id": first.prompt.prompt_id, "plan_seq": 0, "a": 1.0, "b": 1.0, "s": 0, "f": 3}},
        "book": {
            "seq": 2,
            "pending": {
                str(second.prompt.prompt_id): [
                    {"prompt_id": second.prompt.prompt_id, "plan_seq": 1, "a": 1.0, "b": 1.0}
                ]
            },
        },
        "carried": {},
    }
    restored = SaraGate(pool_of(4), group_size=8, config=SaraConfig(history_discount=1.0))
    restored.load_state_dict(old)
    assert restored.open_groups == 2
    for group_id in (0, 1):  # what train --resume does with the groups open at an earlier release's checkpoint
        restored.on_closed(closing_from_state({"group_id": group_id}), committed=False)
    assert restored.open_groups == 0
    assert restored._prior_of(first.prompt.prompt_id) == (1.0, 1.0)
    assert "book" not in restored.state_dict()
