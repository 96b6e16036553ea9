"""HoraGate: probes, the batch allocation (= hora_allocate), variable group sizes, budgets."""

from __future__ import annotations

import pytest
from gate_harness import GateHarness, HarnessConfig
from gate_units import admit, closing, kinds, on_step, pool_of, snap, update

from controller.allocation import hora_allocate
from controller.config import HoraConfig
from controller.gates.hora import HoraGate
from pipeline.types import ActionKind, TrainBatch

METHODS_SUCCESSES = (0, 0, 1, 2, 2, 3, 4, 4)


def probe_batch(gate, successes, probe=4, target=8):
    plans = admit(gate, slots=100, step=0)
    actions = []
    for gid, (plan, s) in enumerate(zip(plans, successes)):
        actions.append(update(gate, snap(gid, plan.prompt, (1,) * s + (0,) * (probe - s), target=target)))
    return plans, actions


def test_methods_example_allocation():
    # G0 = 4, B = 8, G = 16: R = 8*16 - 8*4 = 96, the worked example of docs/methods.md (HORA)
    gate = HoraGate(pool_of(20), group_size=16, batch_groups=8, config=HoraConfig(probe_size=4))
    assert gate.extra_budget == 96
    plans, actions = probe_batch(gate, METHODS_SUCCESSES, target=16)
    assert len(plans) == 8 and all((p.target_size, p.initial) == (16, 4) for p in plans)
    assert all(kinds(a) == [("hold", gid, 0)] for gid, a in enumerate(actions[:-1]))
    launches = [a.n for a in actions[-1] if a.kind is ActionKind.LAUNCH]
    assert launches == hora_allocate(list(METHODS_SUCCESSES), 4, 96) == [25, 24, 15, 9, 9, 6, 4, 4]
    commits = [a.group_id for a in actions[-1] if a.kind is ActionKind.COMMIT]
    assert commits == list(range(8))  # saturated groups (0/4 and 4/4) are committed too


def test_zero_extra_budget_commits_the_probes_alone():
    gate = HoraGate(pool_of(5), group_size=8, batch_groups=2, config=HoraConfig(probe_size=4, budget=8))
    _, actions = probe_batch(gate, (1, 3))
    assert kinds(actions[-1]) == [("commit", 0, 0), ("commit", 1, 0)]


def test_next_batch_waits_for_the_next_step():
    gate = HoraGate(pool_of(20), group_size=8, batch_groups=2)
    probe_batch(gate, (1, 2))
    assert admit(gate, 10, step=0) == []
    gate.on_closed(closing(0), committed=True)
    gate.on_closed(closing(1), committed=True)
    on_step(gate, 0, TrainBatch(0, ()))
    assert len(admit(gate, 10, step=1)) == 2


def test_failed_probe_is_relaunched_and_a_hopeless_group_replaced():
    gate = HoraGate(pool_of(20), group_size=8, batch_groups=2)
    plans = admit(gate, 10, step=0)
    assert kinds(update(gate, snap(0, plans[0].prompt, (1, 0, 0), failed=1))) == [("launch", 0, 1)]
    last = snap(0, plans[0].prompt, (1,), failed=8)
    assert kinds(update(gate, last)) == [("abandon", 0, 0)]
    gate.on_closed(closing(last), committed=False)
    (replacement,) = admit(gate, 10, step=0)
    assert kinds(update(gate, snap(1, plans[1].prompt, (1, 0, 0, 0)))) == [("hold", 1, 0)]
    actions = update(gate, snap(2, replacement.prompt, (0, 0, 0, 0)))
    assert [a.kind.value for a in actions].count("commit") == 2


def test_compute_matched_batches_in_the_harness():
    p = {i: (i % 7) / 6 for i in range(300)}
    gate = HoraGate(pool_of(300), group_size=8, batch_groups=8)
    harness = GateHarness(gate, p, HarnessConfig(batch_groups=8, steps=5)).run()
    harness.check_invariants()
    for batch in harness.batch_log:
        assert batch.num_rollouts == 8 * 8  # variable sizes, same total as GRPO
    sizes = {len(g.rollouts) for b in harness.batch_log for g in b.groups}
    assert len(sizes) > 1 and min(sizes) >= 4


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ((8, {"probe_size": 10}), r"R=-16 < 0"),
        ((2, {"probe_size": 4, "budget": 7}), r"gate.hora.budget=7 is below one probe round"),
        ((8, {"probe_size": 1}), "probe_size=1"),
        ((8, {"prior": (0.0, 1.0)}), "positive Beta"),
    ],
)
def test_bad_settings_are_rejected(kwargs, match):
    batch_groups, fields = kwargs
    with pytest.raises(ValueError, match=match):
        HoraGate(pool_of(5), group_size=8, batch_groups=batch_groups, config=HoraConfig(**fields))


def test_max_group_size_bounds_every_group_in_the_harness():
    p = {i: (i % 7) / 6 for i in range(300)}
    # Budget 48 over 8 probes of 4: 16 extra, each group taking at most 3 more.
    gate = HoraGate(pool_of(300), group_size=8, batch_groups=8, config=HoraConfig(budget=48, max_group_size=7))
    harness = GateHarness(gate, p, HarnessConfig(batch_groups=8, steps=5)).run()
    harness.check_invariants()
    sizes = [len(g.rollouts) for b in harness.batch_log for g in b.groups]
    assert max(sizes) <= 7 and min(sizes) >= 4 and len(set(sizes)) > 1
    assert all(b.num_rollouts == 48 for b in harness.batch_log)


def test_caps_that_cannot_take_the_budget_leave_it_unspent():
    p = {i: (i % 7) / 6 for i in range(300)}
    gate = HoraGate(pool_of(300), group_size=8, batch_groups=8, config=HoraConfig(max_group_size=6))
    harness = GateHarness(gate, p, HarnessConfig(batch_groups=8, steps=3)).run()
    assert all(b.num_rollouts == 8 * 6 for b in harness.batch_log)  # 64 budgeted, 48 slots


def test_max_group_size_below_the_probe_is_refused():
    with pytest.raises(ValueError, match=r"gate.hora.max_group_size=3 is below gate.hora.probe_size=4"):
        HoraConfig(max_group_size=3)
