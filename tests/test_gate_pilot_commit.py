"""PilotCommitGate: the keep band, eviction, the buffer and its staleness, exhaustion."""

from __future__ import annotations

import pytest
from gate_harness import GateHarness, HarnessConfig
from gate_units import admit, closing, kinds, on_step, pool_of, snap, update

from controller.config import PilotCommitConfig
from controller.gates.pilot_commit import PilotCommitGate
from controller.gates.rounds import RoundCapError
from pipeline.types import TrainBatch


def judged(gate, pilots):
    """Open a round and judge its first pilots; returns the actions per pilot."""
    prompts = [p.prompt for p in admit(gate, slots=100, step=0)]
    return [update(gate, snap(i, prompts[i], r)) for i, r in enumerate(pilots)], prompts


@pytest.mark.parametrize(
    "pilot, verdict",
    [((0, 0, 0, 0), "defer"), ((1, 0, 0, 0), "commit"), ((1, 1, 1, 0), "commit"), ((1, 1, 1, 1), "skip")],
)
def test_keep_band_of_the_paper(pilot, verdict):
    gate = PilotCommitGate(pool_of(20), group_size=8, batch_groups=4)
    (actions,), _ = judged(gate, [pilot])
    assert actions[-1].reason == verdict


def test_commit_gives_the_rest_of_the_group():
    gate = PilotCommitGate(pool_of(20), group_size=8, batch_groups=4, config=PilotCommitConfig(pilot_size=2))
    (actions,), _ = judged(gate, [(1, 0)])
    assert kinds(actions) == [("launch", 0, 6), ("commit", 0, 0)]


def test_failed_pilot_samples_are_replaced():
    gate = PilotCommitGate(pool_of(20), group_size=8, batch_groups=4)
    prompt = admit(gate, 1, step=0)[0].prompt
    assert kinds(update(gate, snap(0, prompt, (1, 0, 0), failed=1))) == [("launch", 0, 1)]


def test_evicts_after_consecutive_all_correct_pilots_only():
    gate = PilotCommitGate(pool_of(1), group_size=8, batch_groups=1, config=PilotCommitConfig(pilot_factor=1.0))
    reasons = []
    for gid, pilot in enumerate([(1, 1, 1, 1), (1, 0, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1)]):
        on_step(gate, gid - 1, TrainBatch(gid - 1, ())) if gid else None
        prompt = admit(gate, 1, step=gid)[0].prompt
        last = snap(gid, prompt, pilot)
        reasons.append([a.reason for a in update(gate, last)][-1])
        gate.on_closed(closing(last, reasons[-1] == "commit"), committed=reasons[-1] == "commit")
    assert reasons == ["skip", "commit", "skip", "evict"]
    assert gate.source.pool.is_evicted(0)


def test_paper_setting_evicts_on_one_all_correct_pilot():
    gate = PilotCommitGate(pool_of(3), group_size=8, batch_groups=1, config=PilotCommitConfig(evict_after=1))
    (actions,), prompts = judged(gate, [(1, 1, 1, 1)])
    assert actions[-1].reason == "evict" and gate.source.pool.is_evicted(prompts[0].prompt_id)


def test_kept_pilots_wait_in_the_buffer_and_commit_next_step():
    gate = PilotCommitGate(pool_of(20), group_size=8, batch_groups=1)
    (first, second, third), _ = judged(gate, [(1, 0, 0, 0), (0, 1, 1, 0), (0, 0, 0, 0)])
    assert kinds(first) == [("launch", 0, 4), ("commit", 0, 0)]
    assert kinds(second) == [("hold", 1, 0)]
    assert third[-1].reason == "defer"
    gate.on_closed(closing(0), committed=True)
    assert kinds(on_step(gate, 0, TrainBatch(0, ()))) == [("launch", 1, 4), ("commit", 1, 0)]


def test_buffer_entries_older_than_max_age_are_dropped():
    gate = PilotCommitGate(
        pool_of(20), group_size=8, batch_groups=1, config=PilotCommitConfig(pilot_factor=4.0, max_buffer_age=1)
    )
    actions, _ = judged(gate, [(1, 0, 0, 0)] * 4)
    assert [a[-1].kind.value for a in actions] == ["commit", "hold", "hold", "hold"]
    assert kinds(on_step(gate, 0, TrainBatch(0, ()))) == [("launch", 1, 4), ("commit", 1, 0)]  # age 1: kept
    dropped = on_step(gate, 1, TrainBatch(1, ()))  # age 2 > 1
    assert [(a.kind.value, a.group_id, a.reason) for a in dropped] == [("abandon", 2, "stale"), ("abandon", 3, "stale")]


def test_no_new_round_while_the_buffer_covers_the_step():
    gate = PilotCommitGate(pool_of(20), group_size=8, batch_groups=1)
    judged(gate, [(1, 0, 0, 0), (1, 0, 0, 0), (1, 0, 0, 0)])
    assert admit(gate, 10, step=1) == []  # two pilots wait for step 1 and the next


def test_pool_emptied_by_eviction_stalls_with_exhausted_gate():
    p = {i: 1.0 for i in range(6)}
    gate = PilotCommitGate(pool_of(6), group_size=8, batch_groups=2, config=PilotCommitConfig(evict_after=1))
    harness = GateHarness(gate, p, HarnessConfig(batch_groups=2, steps=3)).run()
    assert harness.stop_reason == "stalled"
    assert gate.exhausted and gate.source.active == 0
    assert admit(gate, 4, step=0) == []
    assert gate.metrics()["gate/evict"] == 6
    harness.check_invariants()


def test_default_eviction_keeps_a_mostly_easy_pool_alive():
    """The reference simulation's lesson: pilots of 4 evicting on one all-correct pilot empty the pool."""
    p = {i: 0.8 for i in range(60)}
    runs = {}
    for evict_after in (1, 2):
        gate = PilotCommitGate(
            pool_of(60), group_size=8, batch_groups=8, config=PilotCommitConfig(evict_after=evict_after)
        )
        harness = GateHarness(gate, p, HarnessConfig(batch_groups=8, steps=15)).run()
        runs[evict_after] = (harness.stop_reason, 60 - gate.source.active)
    assert runs[1] == ("stalled", 60)
    assert runs[2][0] == "steps" and runs[2][1] < 30


def test_round_cap_fill_keeps_the_pilots_closest_to_one_half():
    gate = PilotCommitGate(
        pool_of(20), group_size=16, batch_groups=1, config=PilotCommitConfig(pilot_size=8, max_rounds=1)
    )
    prompts = [p.prompt for p in admit(gate, 10, step=0)]
    out = []
    for gid, pilot in enumerate([(0,) * 8, (1,) * 7 + (0,), (0,) * 8]):
        out += update(gate, snap(gid, prompts[gid], pilot, target=16))
    assert [(a.kind.value, a.group_id, a.reason) for a in out] == [
        ("hold", 0, "fallback_candidate"),
        ("hold", 1, "fallback_candidate"),  # p_hat = 7/8, above the band: too easy
        ("hold", 2, "fallback_candidate"),
        ("abandon", 0, "defer"),
        ("abandon", 2, "defer"),
        ("launch", 1, "pilot_commit n_c"),  # the closest to p_hat = 0.5 fills the step
        ("commit", 1, "commit"),
    ]
    assert gate.metrics()["gate/round_cap"] == 1


def test_round_cap_error_and_fill_in_the_harness():
    p = {i: 0.0 for i in range(100)}
    with pytest.raises(RoundCapError, match="gate.pilot_commit.max_rounds=2"):
        gate = PilotCommitGate(
            pool_of(100), group_size=8, batch_groups=2, config=PilotCommitConfig(max_rounds=2, on_round_cap="error")
        )
        GateHarness(gate, p, HarnessConfig(batch_groups=2, steps=2)).run()
    gate = PilotCommitGate(pool_of(100), group_size=8, batch_groups=2, config=PilotCommitConfig(max_rounds=2))
    harness = GateHarness(gate, p, HarnessConfig(batch_groups=2, steps=2)).run()
    assert harness.stop_reason == "steps"
    harness.check_invariants()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"pilot_size": 9}, "pilot_size=9"),
        ({"p_low": 0.6, "p_up": 0.5}, "band"),
        ({"p_solve": 0.7}, "p_solve"),
        ({"evict_after": -1}, "evict_after"),
        ({"on_round_cap": "skip"}, "fill"),
    ],
)
def test_bad_settings_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PilotCommitGate(pool_of(5), group_size=8, batch_groups=2, config=PilotCommitConfig(**kwargs))


def test_an_abandon_replaced_by_an_intervention_is_judged_again_without_a_second_eviction_count():
    gate = PilotCommitGate(pool_of(20), group_size=8, batch_groups=4)
    prompt = admit(gate, 1, step=0)[0].prompt
    assert [a.reason for a in update(gate, snap(0, prompt, (1, 1, 1, 1)))] == ["skip"]
    actions = update(gate, snap(0, prompt, (1, 1, 1, 1, 0, 0)))  # two recovery samples failed: 4/6 in band
    assert kinds(actions) == [("launch", 0, 2), ("commit", 0, 0)]
    assert gate._streak == {prompt.prompt_id: 1}
