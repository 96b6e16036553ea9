"""DynamicSamplingGate: rounds, surplus (discarded or held), the round cap."""

from __future__ import annotations

import pytest
from gate_harness import GateHarness, HarnessConfig
from gate_units import admit, closing, kinds, on_step, pool_of, snap, update

from controller.config import DsConfig
from controller.gates.dynamic_sampling import DynamicSamplingGate
from controller.gates.rounds import RoundCapError
from pipeline.types import TrainBatch

MIXED, ZEROS, ONES = (1, 0, 0, 1), (0, 0, 0, 0), (1, 1, 1, 1)


def gate_with_round(batch_groups=1, **kwargs):
    gate = DynamicSamplingGate(pool_of(50), group_size=4, batch_groups=batch_groups, config=DsConfig(**kwargs))
    plans = admit(gate, slots=100, step=0)
    return gate, [p.prompt for p in plans]


def test_round_is_oversample_times_batch_and_waits_for_judgement():
    gate, prompts = gate_with_round(batch_groups=2)
    assert len(prompts) == 6
    assert admit(gate, 10, step=0) == []  # the round is not judged yet
    for gid, prompt in enumerate(prompts[:5]):
        update(gate, snap(gid, prompt, ZEROS, target=4))
    assert admit(gate, 10, step=0) == []
    update(gate, snap(5, prompts[5], ONES, target=4))
    assert len(admit(gate, 10, step=0)) == 6  # round 2 of the same step


def test_waits_for_every_sample_of_a_group():
    gate, prompts = gate_with_round()
    assert update(gate, snap(0, prompts[0], (1, 0, 0), in_flight=1, target=4)) == []


def test_surplus_is_discarded_by_default():
    gate, prompts = gate_with_round()
    results = [update(gate, snap(i, prompts[i], r, target=4))[0] for i, r in enumerate([ZEROS, MIXED, MIXED])]
    assert [(a.kind.value, a.reason) for a in results] == [
        ("abandon", "zero_std"),
        ("commit", "effective"),
        ("abandon", "surplus"),
    ]
    assert gate.metrics()["gate/surplus"] == 1


def test_keep_surplus_holds_and_commits_at_the_next_step():
    gate, prompts = gate_with_round(keep_surplus=True)
    assert kinds(update(gate, snap(0, prompts[0], MIXED, target=4))) == [("commit", 0, 0)]
    assert kinds(update(gate, snap(1, prompts[1], MIXED, target=4))) == [("hold", 1, 0)]
    # at most batch_groups are held; the rest is discarded
    assert [a.reason for a in update(gate, snap(2, prompts[2], MIXED, target=4))] == ["surplus"]
    gate.on_closed(closing(0), committed=True)
    actions = on_step(gate, 0, TrainBatch(0, ()))
    assert [(a.kind.value, a.group_id, a.reason) for a in actions] == [("commit", 1, "surplus_committed")]
    assert admit(gate, 10, step=1) == []  # step 1 is already full with the held group


def test_dropped_commit_frees_its_place():
    gate, prompts = gate_with_round()
    update(gate, last := snap(0, prompts[0], MIXED, target=4))
    gate.on_closed(closing(last, committed=True), committed=False)  # the orchestrator dropped it
    assert [a.reason for a in update(gate, snap(1, prompts[1], MIXED, target=4))] == ["effective"]


def test_round_cap_error_names_the_knobs():
    gate = DynamicSamplingGate(
        pool_of(50), group_size=4, batch_groups=1, config=DsConfig(max_rounds=2, on_round_cap="error")
    )
    gid = 0
    with pytest.raises(RoundCapError, match=r"0/1 effective groups for step 0 in gate.ds.max_rounds=2"):
        for _ in range(2):
            for plan in admit(gate, 10, step=0):
                update(gate, snap(gid, plan.prompt, ZEROS, target=4))
                gid += 1
    assert gid == 5  # raised by the update of the sixth group, the last of round 2


def test_round_cap_fill_commits_the_last_rounds_groups():
    gate = DynamicSamplingGate(pool_of(50), group_size=4, batch_groups=1, config=DsConfig(max_rounds=2))
    gid, actions = 0, []
    for _ in range(2):
        for plan in admit(gate, 10, step=0):
            actions += update(gate, snap(gid, plan.prompt, ZEROS, target=4))
            gid += 1
    summary = [(a.kind.value, a.group_id, a.reason) for a in actions]
    assert summary[:3] == [("abandon", i, "zero_std") for i in range(3)]
    assert summary[3:6] == [("hold", i, "fallback_candidate") for i in range(3, 6)]
    assert summary[6:] == [("commit", 3, "fallback"), ("abandon", 4, "zero_std"), ("abandon", 5, "zero_std")]
    assert gate.metrics()["gate/round_cap"] == 1


def test_all_unsolvable_pool_fills_every_step_in_the_harness():
    p = {i: 0.0 for i in range(100)}
    gate = DynamicSamplingGate(pool_of(100), group_size=8, batch_groups=4, config=DsConfig(max_rounds=2))
    harness = GateHarness(gate, p, HarnessConfig(batch_groups=4, steps=3)).run()
    assert harness.stop_reason == "steps"
    harness.check_invariants()
    assert gate.metrics()["gate/round_cap"] == 3
    assert not any(g.is_effective for b in harness.batch_log for g in b.groups)


def test_all_unsolvable_pool_raises_in_error_mode():
    p = {i: 1.0 for i in range(100)}
    gate = DynamicSamplingGate(
        pool_of(100), group_size=8, batch_groups=4, config=DsConfig(max_rounds=3, on_round_cap="error")
    )
    with pytest.raises(RoundCapError, match="on_round_cap=fill"):
        GateHarness(gate, p, HarnessConfig(batch_groups=4, steps=3)).run()


def test_rounds_open_only_as_far_as_the_step_ahead_room():
    """DAPO generates every round whole (3 x batch_groups prompts). The orchestrator admits no
    more open or pending groups than the step-ahead room, (max_async_steps + 1) x batch_groups,
    so a larger round opens in parts, and what has not opened when the step is full never
    opens: with room for one batch DS pays for little more than the groups it trains on; with
    room for a whole round it pays for the surplus DAPO pays for (at most a round per step)."""
    p = {i: 0.5 for i in range(400)}  # nearly every group is effective: one round per step
    cost = {}
    for ahead in (0, 2):
        gate = DynamicSamplingGate(pool_of(400), group_size=8, batch_groups=8)
        harness = GateHarness(gate, p, HarnessConfig(batch_groups=8, steps=5, max_async_steps=ahead)).run()
        assert harness.stop_reason == "steps"
        harness.check_invariants()
        cost[ahead] = (harness.stats["rollouts"], gate.metrics().get("gate/surplus", 0.0))
    assert cost[0][0] <= 5 * 8 * 8 + 8 * 8 and cost[0][1] <= 8  # one batch of room: next to no surplus
    assert cost[2][1] >= 4 * 8 and cost[2][0] <= 5 * 24 * 8  # a round of room: surplus paid, at most whole rounds


@pytest.mark.parametrize(
    "kwargs, match",
    [({"oversample": 0.5}, "oversample"), ({"max_rounds": 0}, "max_rounds"), ({"on_round_cap": "skip"}, "fill")],
)
def test_bad_settings_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DynamicSamplingGate(pool_of(5), group_size=8, batch_groups=2, config=DsConfig(**kwargs))


def test_an_abandon_replaced_by_an_intervention_is_judged_again():
    gate, prompts = gate_with_round()
    assert [a.reason for a in update(gate, snap(0, prompts[0], ZEROS, target=4))] == ["zero_std"]
    # the controller launched 2 recovery samples instead of abandoning; one of them succeeded
    assert update(gate, snap(0, prompts[0], ZEROS + (1,), in_flight=1, target=4)) == []
    assert [a.reason for a in update(gate, snap(0, prompts[0], ZEROS + (1, 0), target=4))] == ["effective"]
